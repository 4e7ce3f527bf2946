"""A lower bound on an IOPDDL instance from CP-SAT over the memory limit at a few time steps only.

Every answer of the instance is an answer of the instance without the memory limit at the other
time steps, so the proved optimum of that relaxation bounds the instance from below; when the
binding steps are few (IOPDDL P: the steps around its activation peak) this bound can be exact,
far above the memory relaxation's. With `--solution`, says whether that answer is thereby proved
optimal.

    python benchmarks/iopddl_row_bound.py P --steps 7296:7313 [--solution SOLUTION.json] [--time-limit 600]

An instance is a letter (looked up in `../shared/benchmarks/iopddl`) or a path.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from autoshard.solver import read_iopddl, score
from autoshard.solver.exact import solve_exact
from autoshard.solver.flat import flatten, only_steps

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DIR = REPO.parent / "shared" / "benchmarks" / "iopddl"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("instance", help="instance letter or path to a problem .json[.gz]")
    parser.add_argument("--steps", required=True, help="FIRST:END, the time steps whose memory limit is kept")
    parser.add_argument("--solution", type=Path, help='an answer ({"solution": [...]}) to warm-start from')
    parser.add_argument("--time-limit", type=float, default=600.0)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    path = Path(args.instance)
    if not path.exists():
        path = DEFAULT_DIR / f"asplos-2025-iopddl-{args.instance}.json.gz"
    if not path.exists():
        print(f"instance: no file {args.instance!r}, nor {path} (the instances are in ../shared)", file=sys.stderr)
        return 1
    try:
        first, end = (int(part) for part in args.steps.split(":"))
    except ValueError:
        print(f"--steps: expected FIRST:END (two integers), got {args.steps!r}", file=sys.stderr)
        return 1
    problem = read_iopddl(path)
    fp = flatten(problem)
    relaxed = only_steps(fp, first, end)
    hint = cost = None
    if args.solution is not None:
        answer = np.asarray(json.loads(args.solution.read_text())["solution"], dtype=np.int64)
        cost = score(problem, answer).cost
        hint = fp.from_original(answer)
    print(f"{path.name}: {fp.num_rows} memory rows, {relaxed.num_rows} kept (steps {first}-{end - 1})")
    start = time.monotonic()
    result = solve_exact(relaxed, time_limit_s=args.time_limit, workers=args.workers, hint=hint)
    print(f"lower bound {result.bound:.0f} ({result.status}, {time.monotonic() - start:.1f} s)")
    if cost is not None:
        verdict = "proved optimal" if cost <= result.bound else f"{(cost - result.bound) / cost:.2e} above the bound"
        print(f"solution cost {cost}: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
