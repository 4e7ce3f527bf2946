"""Spatial splits against batch-only splits, for a U-Net whose activations fill memory.

The same U-Net is planned twice on one mesh: free (every option, height and width splits with
halos among them), and with every image-shaped activation pinned to a batch-only split (the batch
over `--batch-axes`, nothing else split). Each is solved without a budget and under
`--memory-budget`; the table gives step time, communication and peak memory per device, or the
planner's infeasibility verdict.

    python benchmarks/unet_spatial.py --mesh x=2,y=2 --batch-axes x --memory-budget 40MiB
"""

from __future__ import annotations

import argparse
import platform
import subprocess

from autoshard.cli.args import parse_bytes
from autoshard.errors import InfeasibleError
from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.models import UNetConfig, unet
from autoshard.planning.hardware import bind_hardware
from autoshard.planning.make_plan import SolveSettings, make_plan


def batch_only(doc: dict, config: UNetConfig, axes: list[str]) -> dict:
    """The document with every activation pinned to its batch split over `axes`: the 4-D tensors
    [batch, height, width, channels] at one of the U-Net's resolutions, forward and backward."""
    sizes = {(config.height >> level, config.width >> level) for level in range(config.levels + 1)}
    pins = [{"tensor": name, "split_axes": [axes]} for name, t in doc["tensors"].items()
            if len(t["shape"]) == 4 and t["shape"][0] == config.batch and tuple(t["shape"][1:3]) in sizes]
    return doc | {"constraints": pins}


def row(name: str, doc: dict, mesh: Mesh, topology: str, budget: float | None, time_limit_s: float) -> str:
    graph = graph_from_json(doc, mesh)
    hw = bind_hardware(topology, mesh)
    settings = SolveSettings(time_limit_s=time_limit_s, memory_budget_bytes=budget)
    limit = _size(budget) if budget else "HBM"
    try:
        result = make_plan(graph, mesh, hw, settings)
    except InfeasibleError as error:
        return f"| {name} | {limit} | infeasible: {str(error).split(';')[0]} | | | |"
    r = result.report
    windowed = [op for op in graph.ops if any(op.nest.windows(l) for l in range(op.nest.num_loops))]
    spatial = [op for op in windowed
               if any(axes and op.nest.windows(l) for l, axes in enumerate(result.plan.options[op.name].loop_axes))]
    return (f"| {name} | {limit} | {r.step_s * 1e3:.4f} ms | {r.communication_s * 1e3:.4f} ms | "
            f"{_size(r.peak_memory_bytes)} | {len(spatial)} of {len(windowed)} |")


def _size(n_bytes: float) -> str:
    return f"{n_bytes / 2 ** 20:.1f} MiB" if n_bytes >= 2 ** 20 else f"{n_bytes / 2 ** 10:.0f} KiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mesh", default="x=2,y=2")
    parser.add_argument("--batch-axes", default="x", help="mesh axes of the batch-only split")
    parser.add_argument("--topology", default="dgx-h100")
    parser.add_argument("--memory-budget", default="40MiB")
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--levels", type=int, default=3)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--size", type=int, default=512, help="height and width")
    parser.add_argument("--base", type=int, default=32)
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--training", action="store_true")
    args = parser.parse_args()
    mesh = Mesh.parse(args.mesh)
    config = UNetConfig(levels=args.levels, batch=args.batch, height=args.size, width=args.size, base=args.base,
                        dtype=args.dtype)
    doc = unet(config, training=args.training)
    budget = parse_bytes(args.memory_budget, "--memory-budget")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"U-Net {config} {'training step' if args.training else 'forward'} on {args.mesh} ({args.topology}); "
          f"commit {commit}, {platform.processor() or platform.machine()}")
    print("| activations | budget | step time | communication | peak memory per device | window ops split in height/width |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, variant in (("free (spatial splits allowed)", doc),
                          (f"batch-only over {args.batch_axes}", batch_only(doc, config, args.batch_axes.split(",")))):
        for limit in (None, budget):
            print(row(name, variant, mesh, args.topology, limit, args.time_limit), flush=True)


if __name__ == "__main__":
    main()
