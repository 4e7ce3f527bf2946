"""The local search's compiled moves under memory pressure that rejects nearly every move."""

import numpy as np

from autoshard.solver.flat import flatten
from autoshard.solver.problem import Problem
from autoshard.solver.search import Search


def _crowded_problem() -> Problem:
    """Three nodes live at the same step with different strategy counts, over the limit whatever
    they choose; each can move to a cheaper strategy of the same usage, which the memory check
    rejects (the row stays over), move after move."""
    costs = ([100, 0, 0, 0], [100, 0], [100, 0, 0])
    usages = ([20, 20, 30, 30], [20, 20], [20, 20, 30])
    return Problem(costs, usages, np.array([[0, 1], [0, 1], [0, 1]]), np.array([[0, 1], [1, 2]]),
                   (np.ones((4, 2), np.int64), np.ones((2, 3), np.int64)), usage_limit=5)


def test_thousands_of_memory_rejections_keep_penalties_finite_and_choices_valid():
    fp = flatten(_crowded_problem())
    assert fp.num_rows == 1 and fp.cap[0] < 0  # the row binds: it must stay
    x0 = np.zeros(fp.n, dtype=np.int64)
    search = Search(fp, x0, seed=3)
    for _ in range(4):
        search.tree_moves(5000, 3)
    assert np.isfinite(search.pen).all()
    assert ((search.best_x >= 0) & (search.best_x < fp.sizes())).all()
    # Only the move that changes no usage is taken (node 1's cheaper twin); the load never grows.
    assert search.best_x.tolist() == [0, 1, 0]
    assert search.best_obj == fp.objective(search.best_x) == 202.0
