"""`solve`: one entry point over the exact model and the large-instance heuristic.

Small instances (`exact.model_fits`: few enough edge variables and memory row terms) get a
short heuristic run for a hint, then CP-SAT for the rest of the time (or, when CP-SAT finds no
solution early on or goes a while without a better solution or bound, the heuristic's turns again
from where they stopped: `EXACT_GIVE_UP_SHARE`, `EXACT_PATIENCE_SHARE`). Larger ones get the
heuristic (memory relaxation + TRW-S + local search + CP-SAT neighbourhoods and relinking) for
the whole time. Every answer carries a certified lower bound: the best of CP-SAT's bound and
the relaxation's. Either stops early once its answer is within the relative `gap_limit` of the
bound.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import numpy as np

from autoshard.solver.exact import model_fits, solve_exact
from autoshard.solver.flat import FlatProblem, flatten
from autoshard.solver.heuristic import Incumbent, Progress, compile_kernels, smallest_usage, start_heuristic
from autoshard.solver.problem import Problem, certified_lower, check_solution, score, within_gap

# CP-SAT on a small instance that finds no solution at all (its hint included) in this share of
# its time gives the rest back to the heuristic: on the test bed's 2-layer GPT steps with tight
# memory it found none in 8.5 s, and the answer was whatever the heuristic's 1.5 s had reached.
EXACT_GIVE_UP_SHARE = 0.3
# CP-SAT that goes this share of the limit without a better solution or a bound closing 0.1% of
# the gap (its best-bound callback counts) gives the rest back to the heuristic's turns, whose
# relaxation lifts the bound where CP-SAT's LP cannot: on B-p1001 CP-SAT held 51 s of 60 without
# moving either (benchmarks/RESULTS.md, issue 37).
EXACT_PATIENCE_SHARE = 0.05
# ... unless the certified gap is already under this: then only CP-SAT's proof can still gain, and
# it keeps the rest (G: the relaxation's bound sits 0.04% under the optimum from 8 s on; the
# proof came in 48-102 s in earlier runs).
EXACT_HANDOVER_GAP = 0.01


@dataclass(frozen=True)
class Result:
    """A solver's answer. `solution` holds one original strategy index per node; `cost` is its
    exact contest cost; `lower_bound` is certified (no solution costs less); `gap` is
    (cost - lower_bound) / cost. `feasible`: the solution fits in memory and chooses no forbidden
    strategy or pair. `status`: "optimal", "feasible", "infeasible" (proved: no such solution
    exists) or "unknown" (none found; `solution` is the answer that breaks the least).
    `stats["first_feasible_s"]`: seconds from the start of `solve` (flattening included) to the
    first plan that fits and chooses nothing forbidden, when one was found."""

    solution: tuple[int, ...]
    cost: int
    lower_bound: int
    gap: float
    feasible: bool
    status: str
    stats: dict = field(default_factory=dict, compare=False)


def solve(problem: Problem, *, time_limit_s: float, workers: int = 1, seed: int = 0,
          hint: list[int] | np.ndarray | None = None, progress: Progress | None = None,
          deterministic: bool = False, gap_limit: float = 0.0, incumbent: Incumbent | None = None) -> Result:
    """Best solution found within `time_limit_s` seconds (fixed work instead of the clock when
    `deterministic`; then the answer depends only on the problem and the seed). The search stops
    early once the best fitting solution is within `gap_limit` of the certified bound,
    (cost - bound) / cost <= gap_limit (status "feasible" unless the bound meets the cost); 0
    stops early only on a proof of optimality. `incumbent(solution)` (original strategy indices)
    is called as better solutions that fit are found, for a caller that may have to stop early."""
    if not 0.0 <= gap_limit < 1.0:
        raise ValueError(f"gap_limit must be in [0, 1), got {gap_limit}")
    compile_kernels()
    start = time.monotonic()
    if problem.num_nodes == 0:
        return Result(solution=(), cost=0, lower_bound=0, gap=0.0, feasible=True, status="optimal")
    fp = flatten(problem)
    flat_hint = fp.from_original(check_solution(problem, hint)) if hint is not None else None
    stats: dict = {"nodes": fp.n, "edges": fp.m, "memory_rows": fp.num_rows, "strategies": len(fp.cost)}
    remaining = max(0.0, time_limit_s - (time.monotonic() - start))
    candidates = [smallest_usage(fp)] + ([flat_hint] if flat_hint is not None else [])
    bound = -math.inf
    optimal = infeasible = False
    exact = model_fits(fp)
    heuristic_share = 0.15 if exact else 1.0
    offer = None if incumbent is None else (lambda x: incumbent(fp.to_original(x)))
    heuristic_start = time.monotonic()
    run = start_heuristic(fp, time_limit_s=remaining * heuristic_share, seed=seed, hint=flat_hint,
                          progress=progress, deterministic=deterministic, gap_limit=gap_limit,
                          workers=workers, incumbent=offer)
    found = run.result()
    candidates.append(found.x)
    bound = max(bound, found.bound)
    stats["heuristic"] = found.stats
    if "first_feasible_s" in found.stats:
        stats["first_feasible_s"] = round(heuristic_start - start + found.stats["first_feasible_s"], 3)
    bound_met = fp.fits(found.x) and within_gap(found.objective, bound, gap_limit)
    stats["method"] = "cp-sat" if exact and not bound_met else "heuristic"
    if exact and not bound_met:
        best_hint = min((c for c in candidates if fp.fits(c)), key=fp.objective, default=found.x)

        def on_progress(cost: float, cp_bound: float, elapsed_s: float) -> None:
            if math.isfinite(cost):
                stats.setdefault("first_feasible_s", round(time.monotonic() - start, 3))
            if progress is not None:
                progress("cp-sat", min(cost, found.objective if fp.fits(found.x) else math.inf),
                         max(bound, cp_bound), time.monotonic() - start)

        remaining = max(0.1, time_limit_s - (time.monotonic() - start))
        result = solve_exact(fp, time_limit_s=remaining, workers=workers, seed=seed, hint=best_hint,
                             deterministic_time=20.0 if deterministic else None, progress=on_progress,
                             gap_limit=gap_limit, solution=offer, give_up_s=EXACT_GIVE_UP_SHARE * remaining,
                             patience_s=None if within_gap(fp.objective(best_hint), bound, EXACT_HANDOVER_GAP)
                             else EXACT_PATIENCE_SHARE * time_limit_s)
        stats["cp_sat_status"] = result.status
        infeasible = result.infeasible
        optimal = result.optimal
        bound = max(bound, result.bound)
        if result.x is not None:
            candidates.append(result.x)
        remaining = time_limit_s - (time.monotonic() - start)
        stalled = result.stalled and not optimal
        if (result.x is None or stalled) and not infeasible and not deterministic and remaining > 0:
            # The heuristic's turns take over where they stopped (multipliers and all), from
            # CP-SAT's answer and bound.
            stats["cp_sat_gave_up_s" if result.x is None else "cp_sat_stalled_s"] = round(result.wall_s, 3)
            turns_before = len(found.stats["phases"])
            again = run.resume(remaining, result.x, bound,
                               idle_s=EXACT_PATIENCE_SHARE * time_limit_s if stalled else result.wall_s)
            candidates.append(again.x)
            bound = max(bound, again.bound)
            stats["heuristic_after_cp_sat"] = {"phases": again.stats["phases"][turns_before:],
                                               "longest_idle_s": again.stats["longest_idle_s"]}
    return _result(problem, fp, candidates, bound, optimal, infeasible, stats, start)


def _result(problem: Problem, fp: FlatProblem, candidates: list[np.ndarray], bound: float, optimal: bool,
            infeasible: bool, stats: dict, start: float) -> Result:
    scored = [(score(problem, fp.to_original(c)), fp.to_original(c)) for c in candidates]
    # A plan fits in memory and chooses nothing forbidden (the contest's score only adds a
    # forbidden choice's cost); failing that, the answer breaking the least.
    fitting = [(s, x) for s, x in scored if s.feasible and s.forbidden == 0]
    if fitting:
        best_score, best = min(fitting, key=lambda item: item[0].cost)
    else:
        best_score, best = min(scored, key=lambda item: (not item[0].feasible, item[0].forbidden, item[0].cost))
    cost = best_score.cost
    integral = certified_lower(bound) if math.isfinite(bound) else 0
    lower = min(integral, cost) if fitting else integral
    if not fitting:
        status = "infeasible" if infeasible else "unknown"
    elif optimal or lower >= cost:
        status, lower = "optimal", cost
    else:
        status = "feasible"
    gap = (cost - lower) / cost if fitting and cost > 0 else (0.0 if fitting else math.inf)
    stats["wall_s"] = round(time.monotonic() - start, 3)
    return Result(solution=tuple(int(s) for s in best), cost=cost, lower_bound=int(lower), gap=gap,
                  feasible=bool(fitting), status=status, stats=stats)
