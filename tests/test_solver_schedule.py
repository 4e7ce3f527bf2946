"""The heuristic's turns of phases: each stops once its budget of rounds (or seconds) without a
better plan or bound is spent, says why, and a cycle in which no phase gained ends the run."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from autoshard.solver.flat import flatten
from autoshard.solver.heuristic import run_heuristic
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


def test_a_stalled_phase_is_abandoned_after_its_rounds_and_a_fruitless_cycle_ends_the_run():
    schedule = dataclasses.replace(SCHEDULE, patience_rounds=2, cycle=("improve", "relax", "wider"),
                                   deterministic_rounds=50)
    found = run_heuristic(flatten(odd_ring(7)), time_limit_s=60.0, deterministic=True, schedule=schedule)
    assert found.objective == 10 and found.bound < found.objective
    turns = [phase for phase in found.stats["phases"] if phase["phase"] != "hubs"]
    assert [phase["phase"] for phase in turns] == ["improve", "relax", "wider"]
    assert [phase["stopped"] for phase in turns[:2]] == ["2 rounds without gain"] * 2
    assert turns[-1]["stopped"] == "2 rounds without gain; every phase of a cycle gained nothing, the run ends"
    assert all(phase["gains"] == 0 for phase in turns)


def test_the_progress_line_names_the_phase_and_why_the_one_before_stopped():
    schedule = dataclasses.replace(SCHEDULE, patience_rounds=1, cycle=("improve", "relax"), deterministic_rounds=50)
    phases: list[str] = []
    run_heuristic(flatten(odd_ring(5)), time_limit_s=60.0, deterministic=True, schedule=schedule,
                  progress=lambda phase, cost, bound, elapsed_s: phases.append(phase))
    assert "relax (after improve: 1 round without gain)" in phases
    assert phases[-1].startswith("done (relax: 1 round without gain; every phase of a cycle gained nothing")
