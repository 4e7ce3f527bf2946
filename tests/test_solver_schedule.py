"""The heuristic's turns of phases: each stops once its budget of rounds (or seconds) without a
better plan or bound is spent and says why; a cycle in which no phase gained grows the budgets.
CP-SAT's bound progress counts as a gain (its best-bound callback)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from autoshard.solver.flat import flatten
from autoshard.solver.exact import Stall, _Progress
from autoshard.solver.heuristic import run_heuristic, start_heuristic
from autoshard.solver.problem import Problem
from autoshard.solver.schedule import SCHEDULE, Patience, gained

DISAGREE = np.array([[10, 0], [0, 10]])


def odd_ring(n: int) -> Problem:
    """n nodes in a ring (n odd), each edge cheap only when its ends differ: some edge must
    agree, so the optimum is 10 while the relaxation's bound stays at 0 (no proof of optimality
    ends the run early, every phase after the first plan finds nothing)."""
    return Problem(node_costs=tuple(np.array([0, 0]) for _ in range(n)),
                   node_usages=tuple(np.array([1, 1]) for _ in range(n)), intervals=np.array([[0, 1]] * n),
                   edges=np.array([[i, (i + 1) % n] for i in range(n)]),
                   edge_costs=tuple(DISAGREE for _ in range(n)), usage_limit=n)


def test_patience_counts_rounds_without_a_gain():
    patience = Patience(3, None, best=100.0, bound=0.0, now=0.0, bound_gain=0.01)
    assert patience.spent(100.0, 0.5, now=1.0) is None  # the bound closed 0.5% of the gap: no gain
    assert patience.spent(90.0, 0.5, now=2.0) is None  # a better plan starts the count again
    assert patience.gains == 1
    assert patience.spent(90.0, 0.5, now=3.0) is None
    assert patience.spent(90.0, 0.5, now=4.0) is None
    assert patience.spent(90.0, 0.5, now=5.0) == "3 rounds without gain"


def test_patience_counts_seconds_without_a_gain():
    patience = Patience(100, 2.0, best=100.0, bound=0.0, now=0.0, bound_gain=0.01)
    assert patience.spent(100.0, 5.0, now=1.5) is None  # 5% of the gap closed: a gain
    assert patience.spent(100.0, 5.0, now=3.0) is None
    assert patience.spent(100.0, 5.0, now=3.5) == "2.0 s without gain"


def test_a_bound_gain_counts_in_any_amount_before_a_plan():
    assert gained(math.inf, 1.0, math.inf, 0.5, bound_gain=0.5)
    assert not gained(math.inf, 0.5, math.inf, 0.5, bound_gain=0.5)


def test_a_bound_creeping_by_crumbs_counts_once_they_add_up():
    patience = Patience(3, None, best=100.0, bound=0.0, now=0.0, bound_gain=0.01)
    assert patience.spent(100.0, 0.6, now=1.0) is None and patience.gains == 0  # 0.6% of the gap
    assert patience.spent(100.0, 1.2, now=2.0) is None and patience.gains == 1  # 1.2% since the last gain


def test_a_fruitless_cycle_grows_the_budgets_and_the_turns_go_on_until_the_rounds_are_spent():
    schedule = dataclasses.replace(SCHEDULE, patience_rounds=2, cycle=("improve", "relax", "wider"),
                                   deterministic_rounds=50)
    found = run_heuristic(flatten(odd_ring(7)), time_limit_s=60.0, deterministic=True, schedule=schedule)
    assert found.objective == 10 and found.bound < found.objective
    turns = [phase for phase in found.stats["phases"] if phase["phase"] != "hubs"]
    assert [phase["phase"] for phase in turns] == ["improve", "relax", "wider"] * 3 + ["improve", "relax"]
    assert [phase["stopped"] for phase in turns] == [
        "2 rounds without gain", "2 rounds without gain", "2 rounds without gain; a cycle without gain, budgets x2",
        "4 rounds without gain", "4 rounds without gain", "4 rounds without gain; a cycle without gain, budgets x4",
        "8 rounds without gain", "8 rounds without gain", "8 rounds without gain; a cycle without gain, budgets x4",
        "8 rounds without gain", "time up"]
    assert all(phase["gains"] == 0 for phase in turns)


def test_the_progress_line_names_the_phase_and_why_the_one_before_stopped():
    schedule = dataclasses.replace(SCHEDULE, patience_rounds=1, cycle=("improve", "relax"), deterministic_rounds=50)
    phases: list[str] = []
    run_heuristic(flatten(odd_ring(5)), time_limit_s=60.0, deterministic=True, schedule=schedule,
                  progress=lambda phase, cost, bound, elapsed_s: phases.append(phase))
    assert "relax (after improve: 1 round without gain)" in phases
    assert "improve (after relax: 1 round without gain; a cycle without gain, budgets x2)" in phases


def test_a_resumed_run_takes_a_better_plan_and_bound_from_elsewhere():
    schedule = dataclasses.replace(SCHEDULE, patience_rounds=2, cycle=("improve", "relax"), deterministic_rounds=8)
    fp = flatten(odd_ring(7))
    run = start_heuristic(fp, time_limit_s=60.0, deterministic=True, schedule=schedule)
    turns_before = len(run.stats["phases"])
    again = run.resume(60.0, bound=5.0)
    assert again.objective == 10 and again.bound == 5.0
    assert [phase["phase"] for phase in again.stats["phases"][turns_before:]][:2] == ["improve", "relax"]
    done = run.resume(60.0, bound=10.0)  # the bound meets the plan: no turn runs
    assert done.bound == 10.0 and run.stats["phases"][-1]["stopped"] == "within the gap limit"


def test_a_stall_watch_counts_better_solutions_and_bounds_that_close_the_gap():
    watch = Stall(1.0, lambda: None, bounds=True, bound_gain=0.01)
    watch.note(100.0, 50.0)
    watch.note(100.0, 50.4)  # 0.8% of the gap: no gain
    assert (watch.best, watch.bound) == (100.0, 50.0)
    watch.note(100.0, 50.6)  # 1.2% since the last gain
    assert watch.bound == 50.6
    only_solutions = Stall(1.0, lambda: None, bounds=False)
    only_solutions.note(100.0, 90.0)
    assert (only_solutions.best, only_solutions.bound) == (100.0, -math.inf)


def test_cp_sat_bound_progress_reaches_the_progress_callback_and_the_stall_watch():
    calls: list[tuple[float, float]] = []
    watch = Stall(1.0, lambda: None, bounds=True)
    progress = _Progress(3, lambda cost, bound, elapsed_s: calls.append((cost, bound)), None, lambda values: values,
                         watch)
    progress.on_bound(10.0)
    progress.on_bound(9.0)  # not better: not reported
    progress.on_bound(12.0)
    assert calls == [(math.inf, 30.0), (math.inf, 36.0)]  # in flat costs (times the scale), before any solution
    assert watch.bound == 36.0
