"""Whole-graph solve against the layer-once composition on deep GPT training steps; prints a
markdown table: wall time by phase, objective, certified bound, each against the whole-graph
certified lower bound.

    python benchmarks/layer_once.py --layers 24 48 96 --size 1.3b 22b --mesh pp=2,dp=4,tp=8 --time-limit 30

Each case runs in a fresh process (one at a time: the machine is shared), whole graph first
(`make_plan`), then composed (`plan_layer_once`): both solve the same formulation, so their
objectives and certified bounds are in the same units. `--whole-up-to N` skips the whole-graph
solve above N layers (the composed row is then measured against nothing). A mesh of more than 8
devices is bound to DGX H100 nodes of 8 GPUs (the last axis inside a node), as in
`transformer_bench.py`.

    python benchmarks/layer_once.py --exact --time-limit 120

solves small GPT and MLP training steps to optimality both ways instead (`EXACT_CASES`).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

# hidden, heads, seq, batch, vocab: GPT-3 XL (1.3B) and a 22B width (hidden 6144, 48 heads)
SIZES = {"1.3b": (2048, 16, 2048, 8, 50257), "22b": (6144, 48, 2048, 8, 50257)}


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, nargs="+", default=[24, 48, 96])
    p.add_argument("--size", nargs="+", choices=sorted(SIZES), default=["1.3b", "22b"])
    p.add_argument("--mesh", default="pp=2,dp=4,tp=8")
    p.add_argument("--topology", default="dgx-h100")
    p.add_argument("--time-limit", type=float, default=30.0, help="solver seconds per plan (default %(default)s)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--whole-up-to", type=int, default=96, help="skip the whole-graph solve above this many layers")
    p.add_argument("--methods", nargs="+", choices=("whole", "composed"), default=["whole", "composed"])
    p.add_argument("--jsonl", help="append each measurement as a JSON line to this file")
    p.add_argument("--exact", action="store_true",
                   help="instead: small graphs solved to optimality both ways (CP-SAT, gap 0, deterministic)")
    return p.parse_args(argv)


def measure(size: str, layers: int, mesh_text: str, topology: str, method: str, time_limit: float,
            workers: int) -> dict[str, Any]:
    """One plan of the `size` GPT training step with `layers` layers by `method` (whole, composed)."""
    from autoshard.graph.schema import graph_from_json
    from autoshard.mesh import Mesh
    from autoshard.models import GPTConfig, gpt
    from autoshard.phases import PhaseTimes
    from autoshard.planning.compose import plan_layer_once
    from autoshard.planning.hardware import bind_hardware
    from autoshard.planning.make_plan import SolveSettings, make_plan
    from autoshard.solver.heuristic import compile_kernels

    compile_kernels()  # times of a warm process
    hidden, heads, seq, batch, vocab = SIZES[size]
    phases = PhaseTimes()
    with phases.phase("generate"):
        graph = graph_from_json(gpt(GPTConfig(layers=layers, hidden=hidden, heads=heads, seq=seq, batch=batch,
                                              vocab=vocab), training=True))
    mesh = Mesh.parse(mesh_text)
    devices = mesh.group_size(mesh.axis_names)
    hw = bind_hardware(topology, mesh, nodes=max(1, devices // 8) if devices > 8 else None)
    settings = SolveSettings(time_limit_s=time_limit, workers=workers)
    started = time.perf_counter()
    result = (plan_layer_once if method == "composed" else make_plan)(graph, mesh, hw, settings, phases=phases)
    report, solver = result.report, result.solver
    total = time.perf_counter() - started
    return {"size": size, "layers": layers, "mesh": mesh_text, "method": method, "ops": len(graph.ops),
            "phases": {name: round(entry["wall_s"], 2) for name, entry in phases.to_json().items()},
            "total_s": round(total, 2), "objective_ps": solver["objective_ps"],
            "lower_bound_ps": solver["lower_bound_ps"], "status": solver["status"], "step_s": report.step_s,
            "peak_bytes": report.peak_memory_bytes, "composition": solver.get("composition"),
            "time_limit_s": time_limit}


HEADER = ("| width | layers | method | formulate s | solve s | pricing s | total s | objective | certified bound "
          "| objective / whole bound | bound / whole bound | step time |\n"
          "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")


def row(r: dict[str, Any], whole_bound: int | None) -> str:
    phases = r["phases"]
    against = (lambda v: f"{v / whole_bound:.4f}") if whole_bound else (lambda v: "n/a")
    method = r["method"]
    if r["composition"]:
        method += f" ({r['composition']['kinds']} kind, {r['composition']['layers']} layers)"
    return (f"| {r['size']} | {r['layers']} | {method} | {phases.get('formulate', 0):.1f} "
            f"| {phases.get('solve', 0):.1f} | {phases.get('pricing', 0):.1f} | {r['total_s']:.1f} "
            f"| {r['objective_ps'] / 1e9:.4f} ms | {r['lower_bound_ps'] / 1e9:.4f} ms | {against(r['objective_ps'])} "
            f"| {against(r['lower_bound_ps'])} | {r['step_s'] * 1e3:.2f} ms |")


# (graph, layers, mesh) of the exact table: GPT hidden 64, 4 heads, seq 16, batch 4, vocab 128; MLP hidden 32, batch 8
EXACT_CASES = [("gpt", 4, "dp=2,tp=2"), ("gpt", 5, "dp=2,tp=2"), ("gpt", 6, "dp=2,tp=2"),
               ("mlp", 4, "tp=2"), ("mlp", 4, "dp=2,tp=2"), ("mlp", 6, "dp=2,tp=2")]


def exact(model: str, layers: int, mesh_text: str, time_limit: float) -> str:
    """A table row: the whole-graph optimum against the composed plan and bound."""
    from autoshard.graph.schema import graph_from_json
    from autoshard.mesh import Mesh
    from autoshard.models import GPTConfig, MLPConfig, gpt, mlp
    from autoshard.planning.compose import plan_layer_once
    from autoshard.planning.hardware import bind_hardware
    from autoshard.planning.make_plan import SolveSettings, make_plan

    document = (gpt(GPTConfig(layers=layers, hidden=64, heads=4, seq=16, batch=4, vocab=128), training=True)
                if model == "gpt" else mlp(MLPConfig(layers=layers, batch=8, hidden=32), training=True))
    graph, mesh = graph_from_json(document), Mesh.parse(mesh_text)
    hw = bind_hardware("dgx-h100", mesh)
    settings = SolveSettings(time_limit_s=time_limit, deterministic=True, gap_limit=0.0)
    whole, composed = make_plan(graph, mesh, hw, settings).solver, plan_layer_once(graph, mesh, hw, settings).solver
    optimum = whole["objective_ps"]
    return (f"| {model.upper()}, {layers} layers | {mesh_text} | {composed['composition']['kinds']} "
            f"| {optimum} ps ({whole['status']}) | {composed['objective_ps']} ps | {composed['lower_bound_ps']} ps "
            f"| {composed['objective_ps'] / optimum:.4f} | {composed['lower_bound_ps'] / optimum:.4f} |")


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    if args.exact:
        print("| graph | mesh | kinds | whole optimum | composed objective | composed bound "
              "| composed objective / optimum | composed bound / optimum |\n"
              "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |", flush=True)
        for case in EXACT_CASES:
            print(exact(*case, time_limit=args.time_limit), flush=True)
        return 0
    print(f"GPT training steps on {args.mesh} ({args.topology}), solver limit {args.time_limit:g} s, "
          f"{args.workers} workers\n")
    print(HEADER, flush=True)
    spawn = multiprocessing.get_context("spawn")
    for size in args.size:
        for layers in args.layers:
            methods = [m for m in args.methods if m == "composed" or layers <= args.whole_up_to]
            whole_bound = None
            for method in methods:
                with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:  # a fresh process per plan
                    r = pool.submit(measure, size, layers, args.mesh, args.topology, method, args.time_limit,
                                    args.workers).result()
                if method != "composed":
                    whole_bound = r["lower_bound_ps"]
                print(row(r, whole_bound), flush=True)
                if args.jsonl:
                    with open(args.jsonl, "a") as out:
                        out.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
