"""Our plans compiled by XLA against XLA's own sharding propagation from the usual hand annotations.

For the JAX tests' functions (an MLP, a LLaMA-style block, an SGD training step) on tp=8,
dp=2,tp=4 and dp=2,tp=2,x=2 (8 fake CPU devices):

- (a) our plan (the batch on dp and Megatron weight specs on tp pinned, the rest solved) run with
  `autoshard.frontends.jax.shard`: every value constrained as planned;
- (b) `jax.jit` with the same annotations on the arguments only, nothing on intermediates or
  results: XLA's propagation decides the rest.

Both are priced by our cost model (`dgx-h100`) from the collectives in the compiled HLO: the bytes
per device and the communication seconds. On one 8-GPU node every mesh axis has the same links,
so a collective's axes are taken to be the first mesh axes whose sizes multiply to its group size.
The compute is not priced for (b): XLA's shardings of the intermediates are not read back.
Also printed: our plan's collectives beside XLA's compilation of them, per kind.

    python benchmarks/jax_vs_xla.py
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()

import itertools  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Sequence  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent.parent / "tests" / "frontend_jax"))  # the tested functions

import jax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from jax_models import CASES  # noqa: E402
from proofs import COLUMN_PARALLEL, MESHES, ROW_PARALLEL, TOPOLOGY, jax_mesh, prove  # noqa: E402

import autoshard  # noqa: E402
from autoshard.frontends.jax.hlo import Collective, compiled_collectives  # noqa: E402
from autoshard.frontends.jax.trace import argument_paths  # noqa: E402

PRICE_KIND = {"all-reduce": "all_reduce", "all-gather": "all_gather", "reduce-scatter": "reduce_scatter",
              "all-to-all": "all_to_all", "collective-permute": "send_recv"}


def axes_of(mesh: autoshard.Mesh, collective: Collective) -> tuple[str, ...]:
    """The first mesh axes whose sizes multiply to the group size; a permute, or a group over part of
    an axis (XLA may split one), is priced on the first axis (all links are alike on one node)."""
    if collective.kind != "collective-permute":
        for count in range(1, len(mesh.axis_names) + 1):
            for axes in itertools.combinations(mesh.axis_names, count):
                if mesh.group_size(axes) == collective.group_size:
                    return axes
    return mesh.axis_names[:1]


def priced(collectives: Sequence[Collective], mesh: autoshard.Mesh, hardware: Any) -> tuple[float, int]:
    seconds = sum(hardware.collective_seconds(PRICE_KIND[c.kind], axes_of(mesh, c), c.bytes_per_device)
                  for c in collectives if c.group_size > 1)
    return seconds, sum(c.bytes_per_device for c in collectives)


def hand_annotated(case: str, mesh: autoshard.Mesh) -> list[Collective]:
    """XLA's propagation from the batch on dp and Megatron specs on tp, on the arguments only."""
    f, make_args = CASES[case]
    args = make_args()
    batch = P("dp") if "dp" in mesh.axis_names else P()
    specs = {f"params['{w}']": P(None, "tp") for w in COLUMN_PARALLEL} | {f"params['{w}']": P("tp") for w in ROW_PARALLEL}
    leaves = [specs.get(path, batch if path in ("x", "y") else P()) for path, _ in argument_paths(f, args)]
    jm = jax_mesh(mesh, "Auto")
    tree = jax.tree_util.tree_structure(tuple(args))
    in_shardings = jax.tree_util.tree_unflatten(tree, [NamedSharding(jm, s) for s in leaves])
    compiled = jax.jit(f, in_shardings=in_shardings).lower(*args).compile()
    return compiled_collectives(compiled.as_text())


def summary(collectives: Sequence[Collective]) -> str:
    counts = {kind: sum(1 for c in collectives if c.kind == kind) for kind in PRICE_KIND}
    return ", ".join(f"{n} {kind}" for kind, n in counts.items() if n) or "none"


def main() -> None:
    print("| function | mesh | plan: step (us) | plan: comm (us) | (a) XLA of our plan | (a) bytes/dev | (a) comm (us) "
          "| (b) XLA from hand annotations | (b) bytes/dev | (b) comm (us) | (a) <= (b) |")
    print("| --- | --- | ---: | ---: | --- | ---: | ---: | --- | ---: | ---: | --- |")
    agreement = []
    for case, mesh_text in itertools.product(CASES, MESHES):
        mesh = autoshard.Mesh.parse(mesh_text)
        hardware = autoshard.bind_hardware(TOPOLOGY, mesh)
        proof = prove(case, mesh_text)
        a_s, a_bytes = priced(proof.compiled, mesh, hardware)
        b = hand_annotated(case, mesh)
        b_s, b_bytes = priced(b, mesh, hardware)
        report = proof.result.report
        print(f"| {case} | {mesh_text} | {report.step_s * 1e6:.2f} | {report.communication_s * 1e6:.2f} "
              f"| {summary(proof.compiled)} | {a_bytes} | {a_s * 1e6:.2f} | {summary(b)} | {b_bytes} | {b_s * 1e6:.2f} "
              f"| {'yes' if a_s <= b_s * (1 + 1e-9) else 'NO'} |")
        agreement += [(case, mesh_text, k) for k in proof.comparison]
    print("\nOur plan's collectives beside XLA's compilation of them (count / bytes per device):\n")
    print("| function | mesh | kind | plan | XLA | agrees |")
    print("| --- | --- | --- | --- | --- | --- |")
    for case, mesh_text, k in agreement:
        print(f"| {case} | {mesh_text} | {k.kind} | {k.plan_count} / {k.plan_bytes_per_device} "
              f"| {k.xla_count} / {k.xla_bytes_per_device} | {'yes' if k.agrees else 'allow-listed'} |")


if __name__ == "__main__":
    main()
