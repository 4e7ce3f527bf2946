"""Recomputation of a routed-experts layer under expert parallelism: a Mixtral 8x7B-shaped step of two
layers at one sequence a GPU, NeMo's layout of a pipeline stage pinned (`llama_layout`: dp=2 across two
nodes x ep=8 on a node's GPUs, the experts over ep), planned with each recomputation mode. Prints per
mode the step and its compute and communication, the bytes layer 1 keeps for its backward and the
all-to-alls of layer 1 (`autoshard/graph/recompute.py`: `full` dispatches and combines again in the
recomputed forward, `routed` keeps the dispatched tokens and the experts' outputs).

    python benchmarks/moe_recompute.py [--time-limit 60]
"""

from __future__ import annotations

import argparse

from autoshard.graph.recompute import with_recomputation
from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.models import GPTConfig, gpt
from autoshard.models.llama_layout import llama_constraints
from autoshard.models.training import training_precision
from autoshard.planning.hardware import bind_hardware
from autoshard.planning.kept import kept_activation_bytes
from autoshard.planning.make_plan import SolveSettings, make_plan

MIXTRAL = GPTConfig(layers=2, hidden=4096, heads=32, kv_heads=8, seq=4096, vocab=32000, batch=16, style="llama",
                    moe_experts=8, moe_top_k=2, moe_ffn=14336, moe_capacity_factor=1.25, moe_group_size=1024)
MODES = ("none", "full", "routed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--time-limit", type=float, default=60.0, help="each solve's limit in seconds (default 60)")
    args = parser.parse_args()
    with training_precision("bf16-mixed"):
        document = gpt(MIXTRAL, training=True)
    mesh = Mesh.of(dp=2, ep=8)
    document["constraints"] = llama_constraints(document, False, ("dp", "ep"), expert_axes=("ep",))
    hardware = bind_hardware("dgx-h100", mesh, nodes=2, mapping={"dp": ["node"], "ep": ["gpu"]})
    print("| recompute | step ms | compute ms | communication ms (GB a device) | layer 1 keeps MiB | layer 1's "
          "all-to-alls | solver gap |")
    print("|---|---|---|---|---|---|---|")
    for mode in MODES:
        graph = with_recomputation(graph_from_json(document, mesh), mode, mesh)
        result = make_plan(graph, mesh, hardware, SolveSettings(time_limit_s=args.time_limit, deterministic=True,
                                                                workers=1))
        report = result.report.to_json()
        totals = report["totals"]
        moves = sum(1 for r in report["reshardings"] if "layer1." in r["tensor"]  # forward, copies and gradients
                    for s in r["steps"] if s["kind"] == "all_to_all")
        print(f"| {mode} | {1e3 * totals['step_s']:.2f} | {1e3 * totals['compute_s']:.2f} "
              f"| {1e3 * totals['communication_s']:.2f} ({totals['communication_bytes'] / 1e9:.2f}) "
              f"| {kept_activation_bytes(result.plan, 1) / 2 ** 20:.0f} | {moves} "
              f"| {100 * (result.solver.get('gap') or 0.0):.3f}% |", flush=True)


if __name__ == "__main__":
    main()
