"""`autoshard iopddl`: solve or score an instance of the IOPDDL contest format.

    autoshard iopddl PROBLEM.json[.gz] --time-limit SECONDS [--workers N] [--seed S] [--deterministic] [-o SOLUTION.json]
    autoshard iopddl --score PROBLEM SOLUTION
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from autoshard.cli.args import integer_flag, number_flag
from autoshard.errors import InfeasibleError, InputError, OutOfTime
from autoshard.planning.make_plan import MAX_SEED


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("iopddl", help="solve or score an IOPDDL (contest-format) sharding problem",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("problem", type=Path, help="instance, JSON or gzipped JSON")
    parser.add_argument("solution", type=Path, nargs="?", help="with --score: the solution to score")
    parser.add_argument("--score", action="store_true", help="score SOLUTION instead of solving")
    parser.add_argument("--time-limit", type=number_flag, default=60.0, metavar="SECONDS", help="wall-clock budget")
    parser.add_argument("--workers", type=integer_flag, default=1, help="CP-SAT worker threads")
    parser.add_argument("--seed", type=integer_flag, default=0)
    parser.add_argument("--deterministic", action="store_true",
                        help="a fixed amount of work instead of the clock: the same answer on every run")
    parser.add_argument("-o", "--output", type=Path, help="write the answer JSON here instead of stdout")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from autoshard.solver import read_iopddl, score, solve
    from autoshard.solver.problem import load_solution

    problem = read_iopddl(args.problem)
    if args.score:
        if args.solution is None:
            raise InputError("--score needs a SOLUTION file", "SOLUTION")
        result = score(problem, load_solution(args.solution))
        answer = {"cost": result.cost, "feasible": result.feasible, "peak_usage": result.peak_usage,
                  "usage_limit": problem.usage_limit, "violated_steps": result.violated_steps,
                  "first_violation_step": result.first_violation_step, "forbidden": result.forbidden}
        _emit(answer, args.output)
        return 0
    if args.solution is not None:
        raise InputError("a SOLUTION file is only read with --score", "SOLUTION")
    if not (math.isfinite(args.time_limit) and args.time_limit > 0):
        raise InputError(f"must be a positive number of seconds, found {args.time_limit}", "--time-limit")
    if args.workers < 1:
        raise InputError(f"must be at least 1, found {args.workers}", "--workers")
    if not 0 <= args.seed <= MAX_SEED:
        raise InputError(f"must be in [0, 2**63 - 1], found {args.seed}", "--seed")
    last = [-1e9]
    found = [False]

    def progress(phase: str, cost: float, bound: float, elapsed_s: float) -> None:
        if args.quiet:
            return
        if math.isfinite(cost) and not found[0]:
            found[0] = True
            print(f"[{elapsed_s:7.1f}s] first plan that fits and chooses nothing forbidden", file=sys.stderr,
                  flush=True)
        if elapsed_s - last[0] < 2.0:
            return
        last[0] = elapsed_s
        print(f"[{elapsed_s:7.1f}s] {phase:8s} best {cost:.6g}  bound {bound:.6g}", file=sys.stderr, flush=True)

    result = solve(problem, time_limit_s=args.time_limit, workers=args.workers, seed=args.seed,
                   progress=progress, deterministic=args.deterministic)
    if not args.quiet:
        print(f"{problem.name or args.problem.name}: {result.status}, cost {result.cost}, bound "
              f"{result.lower_bound}, gap {result.gap:.2%}", file=sys.stderr)
    _emit({"solution": list(result.solution), "cost": result.cost, "lower_bound": result.lower_bound,
           "feasible": result.feasible}, args.output)
    if result.status == "infeasible":
        raise InfeasibleError("no assignment fits the usage limit and chooses nothing forbidden (proved); the "
                              "answer written is the one breaking the least")
    if not result.feasible:
        raise OutOfTime(f"no assignment that fits the usage limit and chooses nothing forbidden was found in "
                        f"--time-limit {args.time_limit:g} s (none is proved not to exist); the answer written is "
                        f"the one breaking the least")
    return 0


def _emit(answer: dict, output: Path | None) -> None:
    text = json.dumps(answer)
    if output is None:
        print(text)
    else:
        output.write_text(text + "\n", encoding="utf-8")
