"""The group relink's start from the other side (`group_relink._greedy_mix`): CP-SAT is hinted with
a mix that takes every switching group and drops the cheapest ones until the rows hold."""

import numpy as np

from autoshard.solver.flat import flatten
from autoshard.solver.group_relink import _greedy_mix, relink_groups
from autoshard.solver.problem import Problem


def chain(k: int) -> tuple[np.ndarray, dict[tuple[int, int], float]]:
    """Booleans of k groups in a chain: each switch saves 10 on its node, and an edge costs 20
    while its ends differ, so a switch pays only with its neighbours (as on C, where 117 of 134
    groups switch together and 3 pay alone)."""
    linear = np.full(k, -10.0)
    products: dict[tuple[int, int], float] = {}
    for a in range(k - 1):
        linear[a] += 20.0
        linear[a + 1] += 20.0
        products[(a, a + 1)] = -40.0
    return linear, products


def test_greedy_mix_drops_the_cheapest_group_until_the_row_holds():
    k = 12
    linear, products = chain(k)
    # One row: each switch adds a unit, room for k - 1 of them.
    take = _greedy_mix(linear, products, np.zeros(k, dtype=bool), [], [], np.ones((1, k), dtype=np.int64),
                       np.array([k - 1]))
    assert take is not None
    # An end of the chain is dropped (one edge broken), not a middle group (two).
    assert take.tolist() == [False] + [True] * (k - 1)


def test_greedy_mix_declines_a_mix_that_breaks_a_pair_or_does_not_pay():
    k = 4
    linear, products = chain(k)
    no_rows = (np.zeros((0, k), dtype=np.int64), np.zeros(0, dtype=np.int64))
    assert _greedy_mix(linear, products, np.zeros(k, dtype=bool), [], [], *no_rows).all()
    # Groups 0 and 3 may not switch together (a forbidden pair): the greedy mix is no hint.
    assert _greedy_mix(linear, products, np.zeros(k, dtype=bool), [], [(0, 3)], *no_rows) is None
    # No room for a single switch: nothing pays.
    assert _greedy_mix(linear, products, np.zeros(k, dtype=bool), [], [], np.ones((1, k), dtype=np.int64),
                       np.array([0])) is None


def test_group_relink_takes_the_chain_that_pays_together():
    # The chain as a problem: keeping every node (strategy 0) fits, switching all of them (1)
    # overloads the one row by a unit; the best mix switches all but an end.
    k = 8
    problem = Problem(node_costs=tuple(np.array([10, 0]) for _ in range(k)),
                      node_usages=tuple(np.array([0, 1]) for _ in range(k)),
                      intervals=np.array([[0, 1]] * k), edges=np.array([[a, a + 1] for a in range(k - 1)]),
                      edge_costs=tuple(np.array([[0, 20], [20, 0]]) for _ in range(k - 1)), usage_limit=k - 1)
    fp = flatten(problem)
    best, other = np.zeros(k, dtype=np.int64), np.ones(k, dtype=np.int64)
    mixed = relink_groups(fp, np.arange(k), best, other, 5.0, 0, deterministic_time=5.0)
    assert mixed is not None and fp.fits(mixed)
    assert fp.objective(mixed) == 10 + 20  # one end kept: its node cost and its edge
