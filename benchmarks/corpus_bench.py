"""Run the solver on the generated test bed (`iopddl_corpus.py`) and compare with the best known.

Solves each instance of `corpus_manifest.json` (files in `benchmarks/corpus/`), one at a time,
at its own time limit times `--scale`, checks the answer with the contest scoring, and prints
a markdown table: cost, the best known cost (`corpus_reference.json`, made by an earlier solver,
never by the run being judged), their ratio, the time to the first plan that fits and chooses
nothing forbidden (from the start of `solve`, its flattening included, with the part spent in the
heuristic beside it, and its share of the limit) and the certified gap; then a summary line. `-o FILE` appends one JSON line per
instance (with the commit and command that produced it): `corpus_reference.py` builds the
reference file from such lines.

    python benchmarks/corpus_bench.py [--only NAME,...] [--scale 1.0] [--seed 0] [-o results.jsonl]
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import autoshard
from autoshard.solver import read_iopddl, score, solve

HERE = Path(__file__).resolve().parent
MANIFEST = HERE / "corpus_manifest.json"
REFERENCE = HERE / "corpus_reference.json"
DEFAULT_DIR = HERE / "corpus"


def solver_commit() -> str:
    """The commit of the autoshard package being run (which may be another checkout than this
    script's), with `+dirty` when its tree has uncommitted changes."""
    where = Path(autoshard.__file__).resolve().parent
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=where, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "."], cwd=where, capture_output=True, text=True)
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def run_one(spec: dict, path: Path, scale: float, workers: int, seed: int) -> dict:
    problem = read_iopddl(path)
    limit_s = spec["time_limit_s"] * scale
    started = time.monotonic()
    result = solve(problem, time_limit_s=limit_s, workers=workers, seed=seed)
    wall_s = time.monotonic() - started
    check = score(problem, list(result.solution))
    assert check.cost == result.cost and check.feasible == result.feasible
    feasible = result.feasible and check.forbidden == 0
    return {"name": spec["name"], "nodes": problem.num_nodes, "time_limit_s": limit_s, "workers": workers,
            "seed": seed, "cost": result.cost, "feasible": feasible, "forbidden": check.forbidden,
            "over_memory": not check.feasible, "lower_bound": result.lower_bound,
            "gap": result.gap if feasible else None, "status": result.status,
            "method": result.stats.get("method"), "wall_s": round(wall_s, 3),
            "first_feasible_s": result.stats.get("first_feasible_s"),
            "first_feasible_heuristic_s": result.stats.get("heuristic", {}).get("first_feasible_s")}


def ratio(row: dict, best: int | None) -> float | None:
    return row["cost"] / best if row["feasible"] and best else None


def failure(row: dict) -> str:
    """Why an answer is not a plan: over the memory limit, or choosing forbidden strategies or pairs
    (which the solver's status does not count against it)."""
    reasons = (["over memory"] if row["over_memory"] else []) + (
        [f"{row['forbidden']} forbidden"] if row["forbidden"] else [])
    return "infeasible: " + ", ".join(reasons)


def table_row(row: dict, best: int | None) -> str:
    first, in_heuristic = row["first_feasible_s"], row["first_feasible_heuristic_s"]
    share = f"{first / row['time_limit_s']:.1%}" if first is not None else "-"
    found = ratio(row, best)
    cells = [row["name"], row["nodes"], f"{row['time_limit_s']:g}", row["cost"] if row["feasible"] else failure(row),
             "-" if best is None else best, "-" if found is None else f"{found:.4f}",
             "-" if first is None else f"{first:.2f}", "-" if in_heuristic is None else f"{in_heuristic:.2f}", share,
             "-" if row["gap"] is None else f"{row['gap']:.2%}", row["status"]]
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


def summary(rows: list[dict], best: dict[str, int]) -> str:
    ratios = [r for r in (ratio(row, best.get(row["name"])) for row in rows) if r is not None]
    shares = [row["first_feasible_s"] / row["time_limit_s"] for row in rows if row["first_feasible_s"] is not None]
    feasible = sum(row["feasible"] for row in rows)
    median = f"{statistics.median(ratios):.4f}" if ratios else "-"
    worst = f"{max(ratios):.4f}" if ratios else "-"
    within = sum(r <= 1.01 for r in ratios)
    share = f"{max(shares):.1%}" if shares else "-"
    return (f"feasible {feasible}/{len(rows)}; median cost / best known {median} (worst {worst}, "
            f"{within}/{len(ratios)} within 1%); max time to first feasible {share} of the limit")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", type=Path, default=DEFAULT_DIR, help="the generated instances")
    parser.add_argument("--reference", type=Path, default=REFERENCE, help="best known costs")
    parser.add_argument("--only", default="", help="comma-separated instance names")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every time limit")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("-o", "--output", type=Path, help="append one JSON line per instance here")
    args = parser.parse_args(argv)
    specs = json.loads(MANIFEST.read_text())["instances"]
    wanted = {s.strip() for s in args.only.split(",") if s.strip()}
    unknown = wanted - {spec["name"] for spec in specs}
    if unknown:
        print(f"--only: no such instance {sorted(unknown)} in {MANIFEST.name}", file=sys.stderr)
        return 2
    specs = [spec for spec in specs if not wanted or spec["name"] in wanted]
    missing = [spec["name"] for spec in specs if not (args.dir / f"{spec['name']}.json.gz").exists()]
    if missing:
        print(f"missing in {args.dir}: {', '.join(missing)}; generate them with benchmarks/iopddl_corpus.py",
              file=sys.stderr)
        return 1
    best = {}
    if args.reference.exists():
        best = {name: entry["best_cost"] for name, entry in json.loads(args.reference.read_text())["instances"].items()}
    commit = solver_commit()
    command = shlex.join(["python", *sys.argv])
    print(f"solver at {commit}, {args.workers} workers, seed {args.seed}, time limits x{args.scale:g}\n")
    print("| instance | nodes | limit s | cost | best known | cost / best | first feasible s | of it, in the heuristic s "
          "| share of limit | gap | status |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |", flush=True)
    rows = []
    for spec in specs:
        row = run_one(spec, args.dir / f"{spec['name']}.json.gz", args.scale, args.workers, args.seed)
        rows.append(row)
        print(table_row(row, best.get(spec["name"])), flush=True)
        if args.output is not None:
            with args.output.open("a") as handle:
                handle.write(json.dumps({**row, "commit": commit, "command": command}) + "\n")
    print("\n" + summary(rows, best))
    return 0


if __name__ == "__main__":
    sys.exit(main())
