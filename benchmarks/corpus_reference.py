"""Build `corpus_reference.json`, the best known cost of each test-bed instance, from the JSON
lines of `corpus_bench.py -o` runs (long runs of an earlier solver, never the run being judged).

Per instance it keeps the cheapest feasible cost with the commit and command of the run that
found it, the best certified lower bound of all runs, and every run's cost and status.

    python benchmarks/corpus_reference.py runs_a.jsonl [runs_b.jsonl ...] [-o benchmarks/corpus_reference.json] [--note TEXT]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from corpus_bench import REFERENCE

RUN_FIELDS = ("commit", "command", "time_limit_s", "workers", "seed", "cost", "feasible", "lower_bound",
              "status", "method", "wall_s")


def reference(rows: list[dict]) -> dict[str, dict]:
    by_name: dict[str, list[dict]] = {}
    for row in rows:
        by_name.setdefault(row["name"], []).append(row)
    instances = {}
    for name, runs in sorted(by_name.items()):
        fitting = [run for run in runs if run["feasible"]]
        if not fitting:
            continue  # nothing known: the bench shows no ratio for it
        best = min(fitting, key=lambda run: run["cost"])
        instances[name] = {
            "best_cost": best["cost"],
            "lower_bound": max(run["lower_bound"] for run in runs),
            "found_by": {"commit": best["commit"], "command": best["command"], "status": best["status"],
                         "method": best["method"]},
            "runs": [{field: run[field] for field in RUN_FIELDS} for run in runs],
        }
    return instances


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", type=Path, nargs="+", help="JSON lines written by corpus_bench.py -o")
    parser.add_argument("-o", "--output", type=Path, default=REFERENCE)
    parser.add_argument("--note", default="", help="how the runs were made (checkout, machine), kept in the file")
    args = parser.parse_args(argv)
    rows = [json.loads(line) for path in args.runs for line in path.read_text().splitlines() if line.strip()]
    document = {
        "about": "Best known cost per instance of the solver test bed: the cheapest feasible answer of the runs "
                 "below (long runs of the solver before the changes it judges; CP-SAT, method 'cp-sat', for "
                 "the instances small enough for the exact model, status 'optimal' where it proved it).",
        "runs_made": args.note,
        "instances": reference(rows),
    }
    args.output.write_text(json.dumps(document, indent=1) + "\n")
    print(f"{len(document['instances'])} instances with a best known cost -> {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
