"""Context parallelism's three realisations priced on one Llama-3-8B-shaped layer (32 heads, 8 kv heads,
hidden 4096, ffn 14336, bf16, forward or training) at 4k-128k tokens on one DGX H100 (mesh x=8): the solver's
plan, then the same plan with its attention (and, training, its gradients) realised as a ring over x (queries
over x, K/V blocks shifted around it), with K/V gathered whole (queries over x), and as a key split over x
(all_reduce combine). Every other op keeps the solver's option; the step includes the reshardings each
realisation needs.

    python benchmarks/ring_attention.py [--lengths 4096 131072] [--mesh x=8] [--training]
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import autoshard
from autoshard.models.gpt import GPTConfig, gpt
from autoshard.models.training import training_precision
from autoshard.ops.nn import KEY_LOOP, QUERY_LOOP
from autoshard.planning.costs import op_cost
from autoshard.planning.options import ShardingOption
from autoshard.planning.report import estimate
from autoshard.planning.ring_attention import takes_ring


def realisation(num_loops: int, axis: str, name: str) -> ShardingOption:
    loops: list[tuple[str, ...]] = [()] * num_loops
    loops[KEY_LOOP if name == "key split" else QUERY_LOOP] = (axis,)
    return ShardingOption(tuple(loops), axis if name == "ring" else None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 32768, 131072])
    parser.add_argument("--mesh", default="x=8")
    parser.add_argument("--training", action="store_true", help="the training step (bf16-mixed)")
    args = parser.parse_args()
    mesh = autoshard.Mesh.parse(args.mesh)
    axis = mesh.axis_names[-1]
    hw = autoshard.bind_hardware("dgx-h100", mesh)
    print("| tokens | solver's attention option | step (solver) | ring | K/V gathered | key split "
          "| attention op: ring / gathered / key split |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | --- |")
    for length in args.lengths:
        config = GPTConfig(style="llama", layers=1, hidden=4096, heads=32, kv_heads=8, ffn=14336, seq=length, batch=1,
                           vocab=128256, dtype="bf16")
        with training_precision("bf16-mixed"):
            graph = autoshard.load_graph(gpt(config, training=args.training), mesh)
        settings = autoshard.SolveSettings(time_limit_s=60, deterministic=True, workers=1)
        result = autoshard.make_plan(graph, mesh, hw, settings)
        attention = next(op for op in graph.ops if op.kind == "attention")
        steps, ops = [], []
        for name in ("ring", "gathered", "key split"):
            option = realisation(attention.nest.num_loops, axis, name)
            realised = {op.name: option for op in graph.ops if takes_ring(op)}  # the attention and its gradients
            plan = replace(result.plan, options={**result.plan.options, **realised})
            steps.append(estimate(plan, hw).step_s)
            ops.append(op_cost(graph, attention, option, mesh, hw).seconds)
        chosen = result.plan.options[attention.name]
        print(f"| {length:,} | {chosen} | {result.report.step_s * 1e3:.2f} ms | "
              + " | ".join(f"{s * 1e3:.2f} ms" for s in steps) + " | "
              + " / ".join(f"{s * 1e3:.2f}" for s in ops) + " ms |", flush=True)


if __name__ == "__main__":
    main()
