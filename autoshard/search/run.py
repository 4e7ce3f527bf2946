"""The search itself: enumerate candidates, bound each one, drop those that cannot win, solve the
rest best-bound first on a pool of workers, and rank what was found.

Pruning is certified: a candidate is dropped only when its lower bound is at least the objective
of a plan already found (or its least peak memory is over the budget), so no dropped candidate
could have beaten the winner. A candidate the time budget leaves unbounded gets an analytic bound
(`analytic_bound_ps`), so the certified bound covers every candidate. Under `deterministic`, candidate `i` (in bound order) is decided
against the plans of candidates up to `i - slots` only, whichever finished first, so the same
flags give the same ranking on local processes and on Ray.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from autoshard.errors import AutoshardError, InfeasibleError, InputError, OutOfTime, Problem
from autoshard.graph.schema import load_graph
from autoshard.planning.formulation import PICOSECONDS
from autoshard.planning.make_plan import SolveSettings
from autoshard.search.bound import analytic_bound_ps
from autoshard.search.candidates import MAX_AXES, Candidate, enumerate_candidates
from autoshard.search.fanout import Pool, open_pool
from autoshard.search.tasks import SearchInputs, bind_candidate, budget_bytes

POLL_S = 0.2  # how often a waiting search looks at its cancel flag and its time budget


class SearchCancelled(AutoshardError):
    """The search was cancelled (Ctrl-C, the service's cancel) before it finished."""


@dataclass(frozen=True)
class SearchOptions:
    devices: int
    topology: str
    settings: SolveSettings = field(default_factory=SolveSettings)
    max_axes: int = MAX_AXES
    fixed: dict[str, int] = field(default_factory=dict)
    jobs: int = 2  # tasks at a time, local processes or Ray alike
    ray: str | None = None  # None: local processes; "auto" or a cluster address: Ray
    time_budget_s: float | None = None  # the whole search's wall time (None: no limit)

    def __post_init__(self) -> None:
        problems = []
        if not isinstance(self.jobs, int) or self.jobs < 1:
            problems.append(Problem("jobs", f"must be a positive integer, got {self.jobs!r}"))
        if self.time_budget_s is not None and not (math.isfinite(self.time_budget_s) and self.time_budget_s > 0):
            problems.append(Problem("time_budget_s",
                                    f"must be a positive number of seconds, got {self.time_budget_s!r}"))
        if self.ray is not None and not (isinstance(self.ray, str) and self.ray.strip()):
            problems.append(Problem("ray", f"expected 'auto' or a cluster address like ray://host:10001, "
                                           f"got {self.ray!r}"))
        if problems:
            raise InputError(problems)


@dataclass
class Entry:
    """One candidate's progress through the search and what it ended with."""

    candidate: Candidate
    links: dict[str, str]  # axis -> links it runs over
    bound: dict[str, Any] | None = None
    outcome: str = "waiting"  # solved | pruned | infeasible | unsolved
    reason: str = ""
    solved: dict[str, Any] | None = None
    prices: Any = field(default=None, repr=False)  # the bound's resharding prices, until the solve takes them

    @property
    def bound_ps(self) -> int:
        return self.bound["bound_ps"] if self.bound else 0


@dataclass
class SearchResult:
    entries: list[Entry]  # ranked: solved by objective, then the rest by bound
    counts: dict[str, int]
    best: Entry | None
    certified_bound_ps: int  # no plan on any candidate costs less
    wall_s: float
    where: str

    def no_plan_error(self) -> AutoshardError:
        """Why no candidate has a plan (`best` is None): the time budget ran out before some
        candidate was solved (`OutOfTime`: not a proof that none has one), or every candidate was
        found to have no plan within the memory budget (`InfeasibleError`)."""
        unsolved = self.counts["unsolved"]
        if unsolved:
            return OutOfTime(f"the search's time budget ran out before any candidate had a plan ({unsolved} of "
                             f"{self.counts['candidates']} candidates were not solved)")
        return InfeasibleError("no candidate has a plan within the memory budget")

    @property
    def gap(self) -> float | None:
        """How far the winner may be from the best plan of every candidate (solver gaps and pruning included)."""
        if self.best is None or not self.best.solved["objective_ps"]:
            return None
        objective = self.best.solved["objective_ps"]
        return max(objective - self.certified_bound_ps, 0) / objective


Progress = Callable[[str, int, int, Entry], None]  # (phase, done, total, entry that just finished)


def search(graph_document: dict[str, Any], options: SearchOptions, *, progress: Progress | None = None,
           cancelled: Callable[[], bool] | None = None) -> SearchResult:
    started = time.perf_counter()
    deadline = started + options.time_budget_s if options.time_budget_s is not None else math.inf
    cancelled = cancelled or (lambda: False)
    enumeration = enumerate_candidates(options.topology, options.devices, max_axes=options.max_axes,
                                       fixed=options.fixed)
    inputs = SearchInputs(graph_document, options.topology, options.settings)
    entries, hardwares = [], {}
    for candidate in enumeration.candidates:
        hardware = hardwares[candidate] = bind_candidate(inputs, candidate)
        entries.append(Entry(candidate, {a: hardware.axis_link_class(a) for a in candidate.axis_names}))
    graph = load_graph(graph_document)  # a bad graph is refused before any worker starts (its constraints: per candidate)

    def analytic(entry: Entry) -> dict[str, Any]:
        """The bound of a candidate the search had no time to formulate (no least peak memory: 0)."""
        hardware = hardwares[entry.candidate]
        return {"bound_ps": analytic_bound_ps(graph, options.devices, hardware, options.settings.weights),
                "least_peak_bytes": 0, "memory_budget_bytes": budget_bytes(inputs, hardware), "bound_s": 0.0,
                "analytic": True}

    pool = open_pool(inputs, options.jobs, options.ray)
    running: dict[Any, Entry] = {}
    try:
        _bound_all(pool, entries, running, deadline, cancelled, progress, analytic)
        _solve_best_first(pool, entries, running, options, deadline, cancelled, progress)
    except BaseException:
        pool.close(cancel=list(running))
        raise
    pool.close()
    return _result(entries, enumeration.placements, time.perf_counter() - started, pool.where)


def _wait(pool: Pool, running: dict[Any, Entry], cancelled: Callable[[], bool]) -> list[Any]:
    """Handles that finished; raises SearchCancelled once asked to stop."""
    while True:
        if cancelled():
            raise SearchCancelled("the search was cancelled")
        done = pool.wait(list(running), POLL_S)
        if done:
            return done


def _bound_all(pool: Pool, entries: list[Entry], running: dict[Any, Entry], deadline: float,
               cancelled: Callable[[], bool], progress: Progress | None,
               analytic: Callable[[Entry], dict[str, Any]]) -> None:
    # A candidate's bound costs more the more mesh axes it has (its options and resharding states
    # grow with them: the 16-device GPT's 4-axis candidate 38 s, each other one under 6 s). With
    # no time budget every candidate is bounded, and the costliest first ends the phase soonest;
    # under a budget the cheapest go first, so that more are bounded before it is spent.
    queue = list(entries) if math.isfinite(deadline) else sorted(entries, key=lambda e: -len(e.candidate.axis_sizes))
    finished = 0
    while queue or running:
        if queue and time.perf_counter() >= deadline:
            for entry in queue:
                entry.outcome, entry.bound = "unsolved", analytic(entry)
                entry.reason = ("the search's time budget was spent before its bound; its bound is analytic (its "
                                "FLOPs over every device at peak, its inputs and parameters over every device)")
            queue.clear()
        while queue and len(running) < pool.slots:
            entry = queue.pop(0)
            running[pool.submit("bound", entry.candidate, 0.0)] = entry
        if not running:
            break
        for handle in _wait(pool, running, cancelled):
            entry = running.pop(handle)
            bound = pool.result(handle)
            finished += 1
            if "infeasible" in bound:
                entry.outcome, entry.reason = "infeasible", bound["infeasible"]
            else:
                entry.prices = bound.pop("prices", None)
                entry.bound = bound
            if entry.bound and entry.bound["least_peak_bytes"] > entry.bound["memory_budget_bytes"]:
                entry.outcome, entry.prices = "pruned", None
                entry.reason = (f"needs at least {entry.bound['least_peak_bytes']} bytes per device, over the memory "
                                f"budget of {entry.bound['memory_budget_bytes']:.0f}")
            if progress:
                progress("bound", finished, len(entries), entry)


def _solve_best_first(pool: Pool, entries: list[Entry], running: dict[Any, Entry], options: SearchOptions,
                      deadline: float, cancelled: Callable[[], bool], progress: Progress | None) -> None:
    order = sorted((e for e in entries if e.outcome == "waiting"), key=_bound_order)
    deterministic = options.settings.deterministic
    decided = 0  # candidates of `order` dispatched or pruned
    finished = 0

    def settle(entry: Entry) -> None:
        nonlocal finished
        finished += 1
        if progress:
            progress("solve", finished, len(order), entry)

    while decided < len(order) or running:
        while decided < len(order) and len(running) < pool.slots:
            # under `deterministic`, decide i only against the plans of 0 .. i - slots, all of them in
            window = order[:max(decided - pool.slots + 1, 0)] if deterministic else order[:decided]
            if deterministic and any(e.outcome == "waiting" for e in window):
                break
            entry = order[decided]
            incumbent = _incumbent(window)
            remaining_s = deadline - time.perf_counter()
            decided += 1
            known, entry.prices = entry.prices, None  # the solve takes them; no one else needs them
            if incumbent is not None and entry.bound_ps >= incumbent.solved["objective_ps"]:
                entry.outcome = "pruned"
                best_s = incumbent.solved["objective_ps"] / PICOSECONDS
                entry.reason = (f"bound {entry.bound_ps / PICOSECONDS:.6g} s >= the {best_s:.6g} s "
                                f"plan of {incumbent.candidate.label}")
                settle(entry)
            elif remaining_s <= 0:
                entry.outcome, entry.reason = "unsolved", "the search's time budget was spent"
                settle(entry)
            else:
                limit_s = min(options.settings.time_limit_s, remaining_s)
                running[pool.submit("solve", entry.candidate, limit_s, known)] = entry
        if not running:
            continue
        for handle in _wait(pool, running, cancelled):
            entry = running.pop(handle)
            solved = pool.result(handle)
            if "infeasible" in solved:
                entry.outcome, entry.reason = "infeasible", solved["infeasible"]
            else:
                entry.outcome, entry.solved = "solved", solved
            settle(entry)


def _incumbent(entries: list[Entry]) -> Entry | None:
    solved = [e for e in entries if e.outcome == "solved"]
    return min(solved, key=_objective_order) if solved else None


def _objective_order(entry: Entry) -> tuple:
    """By objective; at equal objective the mesh with fewer axes (the simpler layout to run) first."""
    return entry.solved["objective_ps"], len(entry.candidate.axis_sizes), entry.candidate.label


def _bound_order(entry: Entry) -> tuple:
    """Best bound first; at equal bounds fewer axes first, which also solve fastest (fewer options per op)."""
    return entry.bound_ps, len(entry.candidate.axis_sizes), entry.candidate.label


def _result(entries: list[Entry], placements: int, wall_s: float, where: str) -> SearchResult:
    solved = sorted((e for e in entries if e.outcome == "solved"), key=_objective_order)
    rest = sorted((e for e in entries if e.outcome != "solved"), key=_bound_order)
    # every candidate's plans cost at least its solver's bound if solved, else its own bound (an
    # analytic one if the time budget left it unformulated: every candidate has one); one
    # whose least peak memory is over the budget, or with no formulation, has no plan at all (a
    # solve that found none in its time limit may still have one: its bound counts)
    floors = [e.solved["lower_bound_ps"] for e in solved]
    floors += [e.bound_ps for e in rest if e.bound and e.bound["least_peak_bytes"] <= e.bound["memory_budget_bytes"]]
    counts = {"placements": placements, "candidates": len(entries)}
    for outcome in ("pruned", "solved", "infeasible", "unsolved"):
        counts[outcome] = sum(e.outcome == outcome for e in entries)
    return SearchResult(solved + rest, counts, solved[0] if solved else None, min(floors) if floors else 0, wall_s,
                        where)
