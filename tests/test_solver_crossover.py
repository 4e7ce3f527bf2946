"""Partition crossover and the repair of forbidden choices: the best mix of two solutions region by
region, checked against brute force on small problems."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from autoshard.solver.crossover import cross
from autoshard.solver.flat import FORBIDDEN, flatten
from autoshard.solver.problem import FORBIDDEN_COST, Problem
from autoshard.solver.search import Search, forbidden_nodes
from autoshard.solver.solve import solve

BAN = FORBIDDEN_COST


def chain(node_costs: list[list[int]], edge_costs: list[list[list[int]]], usages: list[list[int]] | None = None,
          limit: int | None = None) -> Problem:
    """Nodes 0..n-1 in a chain (edge i joins i and i+1), all live at one time step."""
    n = len(node_costs)
    usages = usages or [[0] * len(c) for c in node_costs]
    return Problem(node_costs=tuple(np.array(c) for c in node_costs), node_usages=tuple(np.array(u) for u in usages),
                   intervals=np.array([[0, 1]] * n), edges=np.array([[i, i + 1] for i in range(n - 1)]),
                   edge_costs=tuple(np.array(m) for m in edge_costs), usage_limit=limit)


AGREE = [[0, 1], [1, 0]]  # neighbours pay 1 unless they choose alike


def test_each_region_is_taken_exactly_when_it_lowers_the_cost():
    # x differs from base on {0, 1} (cheaper there) and on {4, 5} (dearer there); 2 and 3 agree.
    fp = flatten(chain([[5, 0], [5, 0], [0, 1], [0, 1], [0, 3], [0, 3]], [AGREE] * 5))
    base = np.zeros(6, dtype=np.int64)
    x = np.array([1, 1, 0, 0, 1, 1])
    mixed = cross(fp, base, x)
    assert mixed.tolist() == [1, 1, 0, 0, 0, 0]
    # The mix is the cheapest of the four ways to take regions.
    options = [np.where(np.isin(np.arange(6), take), x, base) for take in ([], [0, 1], [4, 5], [0, 1, 4, 5])]
    assert fp.objective(mixed) == min(fp.objective(o) for o in options) == 1  # the seam between 1 and 2


def test_a_forbidden_pair_goes_back_to_base_and_the_rest_of_its_region_stays():
    # x is cheaper on nodes 0-3 but its pair (2, 3) is forbidden: 2 and 3 return to base, 0 and 1 stay.
    forbid_11 = [[0, 1], [1, BAN]]
    fp = flatten(chain([[4, 0], [4, 0], [4, 0], [4, 0]], [AGREE, AGREE, forbid_11]))
    base = np.zeros(4, dtype=np.int64)
    x = np.ones(4, dtype=np.int64)
    mixed = cross(fp, base, x)
    assert fp.objective(mixed) < FORBIDDEN
    assert mixed.tolist() == [1, 1, 0, 0]
    assert len(forbidden_nodes(fp, mixed)) == 0


def test_memory_keeps_out_a_region_that_would_overload_a_row():
    # Both regions save cost; taking both needs 4 units of memory where 3 are free.
    fp = flatten(chain([[3, 0], [0, 0], [0, 2]], [[[0, 0], [0, 0]]] * 2, usages=[[0, 2], [0, 0], [0, 2]], limit=3))
    base = np.zeros(3, dtype=np.int64)
    x = np.array([1, 0, 1])
    mixed = cross(fp, base, x)
    assert mixed.tolist() == [1, 0, 0]  # the larger saving first; the other would overload
    assert fp.fits(mixed)


@pytest.mark.parametrize("seed", range(20))
def test_the_mix_is_the_best_set_of_regions_on_random_chains(seed):
    rng = np.random.default_rng(seed)
    n = 7
    costs = [rng.integers(0, 10, 2).tolist() for _ in range(n)]
    edges = [rng.integers(0, 6, (2, 2)).tolist() for _ in range(n - 1)]
    fp = flatten(chain(costs, edges))
    base, x = rng.integers(0, 2, n), rng.integers(0, 2, n)
    regions: list[list[int]] = []  # on a chain: the runs of consecutive differing nodes
    for v in np.flatnonzero(base != x).tolist():
        if regions and regions[-1][-1] == v - 1:
            regions[-1].append(v)
        else:
            regions.append([v])
    best = min(fp.objective(np.where(np.isin(np.arange(n), sum(take, [])), x, base))
               for k in range(len(regions) + 1) for take in itertools.combinations(regions, k))
    assert fp.objective(cross(fp, base, x)) == best


def test_repair_removes_forbidden_pairs_that_tree_moves_cannot_turn():
    # A ring-like chain where every pair must agree, and a decode with one seam: CP-SAT over the ball
    # around the seam turns one side.
    must_agree = [[0, BAN], [BAN, 0]]
    fp = flatten(chain([[0, 1]] * 6, [must_agree] * 5))
    x = np.array([1, 1, 1, 0, 0, 0])
    assert forbidden_nodes(fp, x).tolist() == [2, 3]
    repaired = Search(fp, np.zeros(6, dtype=np.int64), seed=0).repair(x, ball_size=6, time_limit_s=5.0)
    assert len(forbidden_nodes(fp, repaired)) == 0
    assert repaired.tolist() == [0] * 6  # the cheaper way to agree


def test_the_stats_say_when_the_first_feasible_plan_was_found():
    # Smallest usage picks strategy 0 everywhere, which breaks the forbidden pair (2, 3): the first
    # plan that fits and chooses nothing forbidden comes later, and the stats say when.
    must_differ = [[BAN, 0], [0, BAN]]
    problem = chain([[0, 1]] * 4, [AGREE, AGREE, must_differ], usages=[[0, 1]] * 4, limit=4)
    result = solve(problem, time_limit_s=5.0, deterministic=True)
    assert result.feasible and result.cost < FORBIDDEN_COST
    first = result.stats["heuristic"]["first_feasible_s"]
    assert 0.0 < first <= result.stats["wall_s"]
