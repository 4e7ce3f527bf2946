"""Solve benchmark cases under the deterministic budget and record what each run chose, so that two
commits can be shown to make identical plans (a refactoring must not change a single decision).

For every IOPDDL instance found (or `--iopddl A,B`) and every transformer case of the benchmark
tables (`--transformers`), the solver runs with a fixed work budget instead of the clock; each
case is recorded as its cost, certified bound and a SHA-256 digest of the chosen strategies (IOPDDL)
or of the plan document without its timing fields (transformers).

    python benchmarks/deterministic_plans.py -o before.json
    python benchmarks/deterministic_plans.py -o after.json --compare before.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

from autoshard.delivery.document import plan_document
from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.models import GPTConfig, gpt
from autoshard.planning.hardware import bind_hardware
from autoshard.planning.make_plan import SolveSettings, make_plan
from autoshard.solver import read_iopddl, solve
from autoshard.solver.heuristic import compile_kernels

REPO = Path(__file__).resolve().parent.parent
IOPDDL_DIR = REPO.parent / "shared" / "benchmarks" / "iopddl"
TIMING_KEYS = ("formulate_s", "solve_s")
# (style, layers, mesh, training): the shapes of the transformer tables in RESULTS.md, at depths that
# solve in seconds; widths are those of `transformer_bench.SIZES`.
TRANSFORMERS = [
    ("gpt", 2, "tp=8", False), ("gpt", 4, "dp=2,tp=4", False), ("gpt", 4, "dp=8", True),
    ("gpt", 2, "dp=2,tp=4", True), ("gpt", 4, "dp=4,tp=8", True), ("gpt", 2, "pp=2,dp=4,tp=8", True),
    ("llama", 2, "dp=2,tp=4", False), ("llama", 2, "dp=2,tp=4", True),
    ("gpt", 32, "tp=8", False), ("gpt", 8, "dp=4,tp=8", True),
]
WIDTHS = {"gpt": dict(hidden=2048, heads=16, seq=2048, batch=8, vocab=50257),
          "llama": dict(hidden=4096, heads=32, seq=4096, batch=8, vocab=32000)}


def _digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def iopddl_case(path: Path, workers: int) -> dict:
    problem = read_iopddl(path)
    result = solve(problem, time_limit_s=60.0, workers=workers, deterministic=True)
    return {"cost": result.cost, "bound": result.lower_bound, "digest": _digest(list(result.solution))}


def transformer_case(style: str, layers: int, mesh_text: str, training: bool, workers: int) -> dict:
    graph = graph_from_json(gpt(GPTConfig(layers=layers, style=style, **WIDTHS[style]), training=training))
    mesh = Mesh.parse(mesh_text)
    devices = mesh.group_size(mesh.axis_names)
    hardware = bind_hardware("dgx-h100", mesh, nodes=devices // 8 if devices > 8 else None)
    result = make_plan(graph, mesh, hardware, SolveSettings(time_limit_s=30.0, workers=workers, deterministic=True))
    document = plan_document(result, "dgx-h100")
    for key in TIMING_KEYS:
        document["solver"].pop(key)
    document.pop("autoshard_version")
    return {"cost": result.solver["objective_ps"], "bound": result.solver["lower_bound_ps"],
            "digest": _digest(document)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-o", "--output", type=Path, required=True, help="where to write the cases (JSON)")
    parser.add_argument("--iopddl", default="", help="comma-separated instance letters (default: every one found)")
    parser.add_argument("--dir", type=Path, default=IOPDDL_DIR)
    parser.add_argument("--no-iopddl", action="store_true")
    parser.add_argument("--no-transformers", action="store_true")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--only", default="", help="run only the cases whose name contains this text")
    parser.add_argument("--compare", type=Path, help="an earlier output: print which cases differ")
    args = parser.parse_args(argv)
    compile_kernels()
    cases: dict[str, dict] = {}
    wanted = {s.strip() for s in args.iopddl.split(",") if s.strip()}
    jobs = []
    if not args.no_iopddl:
        for path in sorted(args.dir.glob("asplos-2025-iopddl-*.json*")):
            letter = path.name.split("-")[-1].split(".")[0]
            if not wanted or letter in wanted:
                jobs.append((f"iopddl {letter}", lambda path=path: iopddl_case(path, args.workers)))
    if not args.no_transformers:
        for style, layers, mesh_text, training in TRANSFORMERS:
            name = f"{style} {layers} layers {mesh_text} {'training' if training else 'forward'}"
            jobs.append((name, lambda c=(style, layers, mesh_text, training): transformer_case(*c, args.workers)))
    jobs = [(name, job) for name, job in jobs if args.only in name]
    earlier = json.loads(args.compare.read_text()) if args.compare else {}
    print("| case | cost | bound | digest | seconds | same as before |\n| --- | ---: | ---: | --- | ---: | --- |")
    for name, job in jobs:
        started = time.monotonic()
        cases[name] = job()
        seconds = time.monotonic() - started
        same = "-" if name not in earlier else ("yes" if earlier[name] == cases[name] else "**no**")
        print(f"| {name} | {cases[name]['cost']} | {cases[name]['bound']} | {cases[name]['digest']} | {seconds:.0f} "
              f"| {same} |", flush=True)
        args.output.write_text(json.dumps(cases, indent=1) + "\n")
    return 0 if all(earlier.get(name, case) == case for name, case in cases.items()) else 1


if __name__ == "__main__":
    sys.exit(main())
