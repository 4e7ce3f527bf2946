"""Plan generated transformers (forward, or a whole training step) and print a markdown table:
problem size, formulate / solve / total seconds, the plan's step time, certified gap and peak
memory per device.

    python benchmarks/transformer_bench.py --layers 2 4 --mesh tp=8 dp=2,tp=4 --size 1.3b
    python benchmarks/transformer_bench.py --layers 96 --mesh pp=2,dp=4,tp=8 --size 175b --time-limit 60
    python benchmarks/transformer_bench.py --layers 2 --mesh dp=2,tp=4 --style llama --profile out.prof

A mesh with more than 8 devices is bound to DGX H100 nodes of 8 GPUs (the last axis inside a
node). `--profile FILE` runs the first configuration under cProfile and writes its stats.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from dataclasses import dataclass

from autoshard.graph.schema import graph_from_json
from autoshard.graph.summary import size
from autoshard.mesh import Mesh
from autoshard.models import GPTConfig, gpt
from autoshard.planning.hardware import bind_hardware
from autoshard.planning.make_plan import SolveSettings, make_plan
from autoshard.solver.heuristic import compile_kernels


@dataclass(frozen=True)
class ModelSize:
    hidden: int
    heads: int
    seq: int
    batch: int
    vocab: int


# Widths of published models (depth is chosen separately with --layers).
SIZES = {
    "125m": ModelSize(hidden=768, heads=12, seq=2048, batch=8, vocab=50257),
    "1.3b": ModelSize(hidden=2048, heads=16, seq=2048, batch=8, vocab=50257),
    "7b": ModelSize(hidden=4096, heads=32, seq=4096, batch=8, vocab=32000),
    "175b": ModelSize(hidden=12288, heads=96, seq=2048, batch=8, vocab=50257),
}


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, nargs="+", default=[2, 4])
    p.add_argument("--mesh", nargs="+", default=["tp=8", "dp=2,tp=4"], help="meshes such as dp=2,tp=4")
    p.add_argument("--size", choices=sorted(SIZES), default="1.3b", help="model width (default %(default)s)")
    p.add_argument("--style", choices=("gpt", "llama"), default="gpt")
    p.add_argument("--training", action="store_true", help="the whole training step, not just the forward")
    p.add_argument("--batch", type=int, help="global batch (default: the size's)")
    p.add_argument("--topology", default="dgx-h100")
    p.add_argument("--time-limit", type=float, default=30.0, help="solver seconds per run (default %(default)s)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--profile", metavar="FILE", help="cProfile the first run into FILE and print its top entries")
    return p.parse_args(argv)


def _nodes(mesh: Mesh) -> int | None:
    devices = mesh.group_size(mesh.axis_names)
    return max(1, devices // 8) if devices > 8 else None


def run(layers: int, mesh_text: str, args: argparse.Namespace) -> dict:
    s = SIZES[args.size]
    config = GPTConfig(layers=layers, hidden=s.hidden, heads=s.heads, seq=s.seq, batch=args.batch or s.batch,
                       vocab=s.vocab, style=args.style)
    graph = graph_from_json(gpt(config, training=args.training))
    mesh = Mesh.parse(mesh_text)
    hw = bind_hardware(args.topology, mesh, nodes=_nodes(mesh))
    settings = SolveSettings(time_limit_s=args.time_limit, workers=args.workers)
    started = time.perf_counter()
    result = make_plan(graph, mesh, hw, settings)
    total = time.perf_counter() - started
    solver = result.solver
    return {"layers": layers, "mesh": mesh_text, "ops": len(graph.ops), **solver["problem"],
            "formulate_s": solver["formulate_s"], "solve_s": solver["solve_s"], "total_s": total,
            "step_s": result.report.step_s, "gap": solver["gap"], "status": solver["status"],
            "peak": result.report.peak_memory_bytes}


HEADER = ("| layers | mesh | ops | nodes / edges / strategies | formulate s | solve s | total s | step time "
          "| gap | peak memory / device |\n| ---: | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")


def row(r: dict) -> str:
    gap = "optimal" if r["status"] == "optimal" else f"{100 * r['gap']:.2f}%"
    return (f"| {r['layers']} | {r['mesh']} | {r['ops']} | {r['nodes']} / {r['edges']} / {r['strategies']} "
            f"| {r['formulate_s']:.1f} | {r['solve_s']:.1f} | {r['total_s']:.1f} | {1e3 * r['step_s']:.2f} ms "
            f"| {gap} | {size(r['peak'])} |")


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    kind = "training step" if args.training else "forward"
    print(f"{args.style} {args.size} ({kind}), {args.topology}, solver limit {args.time_limit:g} s, "
          f"{args.workers} workers\n")
    print(HEADER, flush=True)
    compile_kernels()  # times of a warm process: the solver's one-off compilation is not any plan's
    first = True
    for layers in args.layers:
        for mesh_text in args.mesh:
            if first and args.profile:
                profiler = cProfile.Profile()
                r = profiler.runcall(run, layers, mesh_text, args)
                profiler.dump_stats(args.profile)
            else:
                r = run(layers, mesh_text, args)
            first = False
            print(row(r), flush=True)
    if args.profile:
        print(file=sys.stderr)
        pstats.Stats(args.profile, stream=sys.stderr).sort_stats("cumulative").print_stats(40)
    return 0


if __name__ == "__main__":
    sys.exit(main())
