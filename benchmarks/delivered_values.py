"""The solver's objective against `estimate` of the plan it returns, and the problem's size and
solve time, for pinned LLaMA training layouts and GPT training steps.

    .venv/bin/python benchmarks/delivered_values.py [--time-limit 30] [--cases fsdp,tp,gpt2,gpt8]

fsdp: a 2-layer LLaMA training step (hidden 512, seq 256, batch 8, vocab 2048, bf16) on `dp=8`,
its matrices and their Adam moments stored split on dim 0 over dp, its batch over dp; tp: the
same on `dp=2,tp=4` with Megatron's column and row splits over tp; gpt2 / gpt8: `autoshard
generate gpt --training --layers 2|8` (default width) on `dp=2,tp=4`, nothing pinned. All on
`dgx-h100`. `objective / estimate - 1` compares the solver's objective (seconds; its tie-break,
1 ps per MiB held, is below 1e-6 of it here) with the step time `estimate` prices for the plan.
"""

from __future__ import annotations

import argparse
import time

from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.models import GPTConfig, gpt
from autoshard.models.layouts import layout_constraints
from autoshard.planning.formulation import formulate
from autoshard.planning.hardware import bind_hardware
from autoshard.planning.make_plan import SolveSettings, make_plan


def pinned_llama(layout: str) -> dict:
    config = GPTConfig(layers=2, hidden=512, heads=8, seq=256, batch=8, vocab=2048, style="llama")
    doc = gpt(config, training=True)
    doc["constraints"] = layout_constraints(doc, config.batch, layout)
    return doc


CASES = {
    "fsdp": ("LLaMA 2 layers, fully-sharded data parallel", lambda: pinned_llama("fsdp"), "dp=8"),
    "tp": ("LLaMA 2 layers, tensor parallel", lambda: pinned_llama("tp"), "dp=2,tp=4"),
    "gpt2": ("GPT 2 layers, free", lambda: gpt(GPTConfig(layers=2), training=True), "dp=2,tp=4"),
    "gpt8": ("GPT 8 layers, free", lambda: gpt(GPTConfig(layers=8), training=True), "dp=2,tp=4"),
}


def run(name: str, time_limit_s: float) -> str:
    title, make_doc, mesh_text = CASES[name]
    mesh = Mesh.parse(mesh_text)
    hw = bind_hardware("dgx-h100", mesh)
    graph = graph_from_json(make_doc(), mesh)
    started = time.perf_counter()
    problem = formulate(graph, mesh, hw, memory_budget_bytes=hw.hbm_bytes).problem
    formulate_s = time.perf_counter() - started
    entries = sum(m.size for m in problem.edge_costs)
    result = make_plan(graph, mesh, hw, SolveSettings(time_limit_s=time_limit_s, workers=2))
    objective_s, step_s = result.solver["objective_s"], result.report.step_s
    return (f"| {title} | {mesh_text} | {problem.num_nodes} | {problem.num_edges} | {int(sum(problem.num_strategies()))} "
            f"| {entries / 1e6:.2f}M | {formulate_s:.2f} | {result.solver['solve_s']:.1f} | {result.solver['status']} "
            f"| {result.solver['gap']:.2e} | {objective_s * 1e3:.4f} | {step_s * 1e3:.4f} "
            f"| {100 * (objective_s / step_s - 1):+.2f}% |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--time-limit", type=float, default=30.0)
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args()
    print("| case | mesh | nodes | edges | strategies | matrix entries | formulate s | solve s | status | gap "
          "| objective ms | estimate ms | objective / estimate - 1 |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name in args.cases.split(","):
        print(run(name, args.time_limit), flush=True)


if __name__ == "__main__":
    main()
