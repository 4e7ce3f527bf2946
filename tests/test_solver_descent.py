"""Descent within the current usages: strategies dropped exactly, usages never raised, and a move
that changes a whole family of nodes at once."""

import numpy as np
import pytest

from autoshard.solver.descent import descend, keep_strategies, within_usage
from autoshard.solver.flat import flatten
from autoshard.solver.problem import Problem
from autoshard.solver.search import Search
from test_solver_optimum import random_problem
from test_solver_reduce import flat_assignments


def _random_keep(fp, rng) -> np.ndarray:
    keep = rng.random(len(fp.cost)) < 0.6
    for v in range(fp.n):
        keep[fp.soff[v] + rng.integers(fp.sizes()[v])] = True
    return keep


@pytest.mark.parametrize("seed", range(8))
def test_kept_strategies_cost_what_they_cost_in_the_whole(seed):
    fp = flatten(random_problem(700 + seed, limited=True, forbidden=seed % 2 == 0))
    keep = _random_keep(fp, np.random.default_rng(seed))
    kept = keep_strategies(fp, keep)
    reached = set()
    for z in flat_assignments(kept):
        x = kept.to_original(z)
        assert np.all(keep[fp.soff[:-1] + x])
        assert kept.objective(z) == fp.objective(x)
        assert kept.fits(z) == fp.fits(x)
        reached.add(tuple(x))
    assert reached == {tuple(x) for x in flat_assignments(fp) if np.all(keep[fp.soff[:-1] + x])}


def test_keeping_no_strategy_of_a_node_is_refused():
    fp = flatten(random_problem(701, limited=True))
    keep = np.ones(len(fp.cost), dtype=bool)
    keep[fp.soff[0]:fp.soff[1]] = False
    with pytest.raises(ValueError, match="every node must keep"):
        keep_strategies(fp, keep)


@pytest.mark.parametrize("seed", range(12))
def test_descent_finds_the_best_assignment_that_raises_no_usage(seed):
    fp = flatten(random_problem(720 + seed, limited=True))
    rng = np.random.default_rng(seed)
    fitting = [x for x in flat_assignments(fp) if fp.fits(x)]
    x = fitting[rng.integers(len(fitting))]
    use = fp.use[fp.soff[:-1] + x]
    in_rows = fp.r1 > fp.r0
    y = descend(fp, x, seed)
    y_use = fp.use[fp.soff[:-1] + y]
    assert np.all(y_use[in_rows] <= use[in_rows])
    assert fp.fits(y)
    within = [z for z in flat_assignments(fp) if np.all(fp.use[fp.soff[:-1] + z][in_rows] <= use[in_rows])]
    assert fp.objective(y) == min(fp.objective(z) for z in within)
    assert within_usage(fp, x).num_rows == 0


def _ring(n: int) -> Problem:
    """A ring of n nodes, strategies (a, b, c): b is cheaper than a and uses less memory, c is
    cheapest and uses the most; neighbours pay 10 to differ. The limit leaves room for a few c."""
    costs = tuple(np.array([2, 1, 0]) for _ in range(n))
    usages = tuple(np.array([2, 1, 10]) for _ in range(n))
    differ = np.full((3, 3), 10) - 10 * np.eye(3, dtype=np.int64)
    edges = np.array([[v, (v + 1) % n] for v in range(n)])
    return Problem(node_costs=costs, node_usages=usages, intervals=np.array([[0, 1]] * n), edges=edges,
                   edge_costs=tuple(differ for _ in range(n)), usage_limit=2 * n + 8)


def test_descent_turns_a_whole_ring_that_block_moves_cannot():
    fp = flatten(_ring(40))
    all_a = np.zeros(fp.n, dtype=np.int64)
    assert fp.fits(all_a)
    search = Search(fp, all_a, 0)
    search.tree_moves(20000, 16)  # any block of up to 16 nodes pays 20 on its border to save 16
    assert search.best_obj == fp.objective(all_a) == 80
    y = descend(fp, all_a, 0)
    assert fp.to_original(y).tolist() == [1] * 40  # all b: c would raise the usage
    assert fp.objective(y) == 40
