"""The first plan: where the smallest-usage choices break forbidden pairs, a plan that fits and
chooses nothing forbidden comes before any relaxation round."""

from __future__ import annotations

import numpy as np

from autoshard.solver.first_plan import low_memory_labelling, memory_problem
from autoshard.solver.flat import FORBIDDEN, flatten
from autoshard.solver.heuristic import HeuristicRun, smallest_usage
from autoshard.solver.kernels import HUB_DEGREE
from autoshard.solver.problem import FORBIDDEN_COST, Problem
from autoshard.solver.schedule import SCHEDULE
from autoshard.solver.search import forbidden_nodes

BAN = FORBIDDEN_COST
MUST_AGREE = np.array([[0, BAN], [BAN, 0]])


def star(leaves: int, limit: int) -> Problem:
    """A hub joined to `leaves` leaves by pairs that must agree, all live at one step. The hub's
    strategy 1 and every leaf's strategy 0 use one unit, the others none: the smallest-usage
    choices (hub 0, leaves 1) break every pair, and within `limit` = 1 the only plan is all 1.
    Strategy 1 costs 5 at every node, so cost alone would pick all 0."""
    n = leaves + 1
    usages = [np.array([0, 1])] + [np.array([1, 0])] * leaves
    return Problem(node_costs=tuple(np.array([0, 5]) for _ in range(n)), node_usages=tuple(usages),
                   intervals=np.array([[0, 1]] * n), edges=np.array([[0, leaf] for leaf in range(1, n)]),
                   edge_costs=tuple(MUST_AGREE for _ in range(leaves)), usage_limit=limit)


def test_the_smallest_usage_start_breaks_every_pair_of_the_hub():
    fp = flatten(star(HUB_DEGREE + 12, limit=1))
    assert len(forbidden_nodes(fp, smallest_usage(fp))) == fp.n


def test_the_memory_problem_prices_usage_and_keeps_forbidden_pairs():
    fp = flatten(star(3, limit=1))
    plain = memory_problem(fp)
    assert plain.num_rows == 0
    assert np.array_equal(plain.mat >= FORBIDDEN, fp.mat >= FORBIDDEN)
    # Usage times rows live dominates; the true cost 5 only breaks ties, far below one unit.
    hub_costs = plain.cost[plain.soff[0]:plain.soff[1]]
    assert hub_costs[0] < 1e-5 and 1.0 <= hub_costs[1] < 1.0 + 1e-5


def test_the_low_memory_labelling_turns_the_hub_with_its_leaves():
    fp = flatten(star(HUB_DEGREE + 12, limit=1))
    x = low_memory_labelling(fp, seed=0, passes=10, moves_per_centre=2, block=16)
    assert x.tolist() == [1] * fp.n
    assert fp.fits(x)


def test_the_first_plan_fits_and_chooses_nothing_forbidden_before_any_round():
    problem = star(HUB_DEGREE + 12, limit=1)
    fp = flatten(problem)
    run = HeuristicRun(fp, time_limit_s=10.0, seed=0, hint=None, progress=None, deterministic=True,
                       gap_limit=0.0, workers=1, schedule=SCHEDULE)
    assert "first_feasible_s" not in run.stats
    run.first_plan()
    assert run.stats["relaxation_rounds"] == 0
    assert fp.fits(run.search.best_x) and len(forbidden_nodes(fp, run.search.best_x)) == 0
    assert run.search.best_x.tolist() == [1] * fp.n
    assert run.stats["first_plan_forbidden"] == 0
    assert run.stats["first_feasible_s"] >= 0.0


def test_a_start_without_forbidden_choices_is_kept_as_it_is():
    problem = star(4, limit=5)  # all 0 fits now and is the cheapest: nothing to do
    fp = flatten(problem)
    run = HeuristicRun(fp, time_limit_s=10.0, seed=0, hint=np.zeros(fp.n, dtype=np.int64), progress=None,
                       deterministic=True, gap_limit=0.0, workers=1, schedule=SCHEDULE)
    run.first_plan()
    assert run.search.best_x.tolist() == [0] * fp.n
    assert "first_plan_forbidden" not in run.stats
