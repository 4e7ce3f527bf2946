"""Random solver problems and brute-force optima to check the solvers against."""

from __future__ import annotations

import itertools

import numpy as np

from autoshard.solver import FORBIDDEN_COST, Problem, score


def random_problem(seed: int, limited: bool, forbidden: bool = False) -> Problem:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 7))
    sizes = rng.integers(1, 4, n)
    costs = [rng.integers(0, 50, s) for s in sizes]
    usages = [rng.integers(0, 20, s) for s in sizes]
    starts = rng.integers(0, 8, n)
    intervals = np.stack([starts, starts + rng.integers(0, 6, n)], axis=1)
    edges, matrices = [], []
    for _ in range(int(rng.integers(1, 2 * n))):
        u, v = (int(a) for a in rng.choice(n, 2, replace=False))
        matrix = rng.integers(0, 40, (sizes[u], sizes[v]))
        if forbidden:
            matrix[rng.random(matrix.shape) < 0.2] = FORBIDDEN_COST
        edges.append([u, v])  # repeated pairs and both directions happen: parallel edges
        matrices.append(matrix)
    limit = None
    if limited:
        lowest = score_peak(costs, usages, intervals, edges, matrices, [int(np.argmin(u)) for u in usages])
        limit = int(lowest + rng.integers(0, 15))
    return Problem(node_costs=tuple(costs), node_usages=tuple(usages), intervals=intervals, edges=edges,
                   edge_costs=tuple(matrices), usage_limit=limit)


def score_peak(costs, usages, intervals, edges, matrices, x) -> int:
    problem = Problem(node_costs=tuple(costs), node_usages=tuple(usages), intervals=intervals, edges=edges,
                      edge_costs=tuple(matrices))
    return score(problem, x).peak_usage


def enumerate_optimum(problem: Problem) -> int | None:
    """Cheapest feasible cost over every assignment avoiding forbidden choices, None if none fits."""
    costs = [score(problem, x) for x in itertools.product(*(range(len(c)) for c in problem.node_costs))]
    fitting = [s.cost for s in costs if s.feasible and s.forbidden == 0]
    return min(fitting) if fitting else None


def flat_assignments(fp):
    return (np.array(x) for x in itertools.product(*(range(s) for s in fp.sizes())))


def frustrated_ring(base: int) -> Problem:
    """Seven nodes of two strategies on a ring with chords; an edge costs 100 when its ends agree.
    An odd ring always has such an edge, but the memory-free relaxation (the local polytope)
    sees none: its bound is short by about 200 of the optimum 7 * base + 203. Each node costs
    `base` (+1 for its second strategy), so that shortfall is a small fraction of the cost."""
    n = 7
    costs = tuple(np.array([base, base + 1]) for _ in range(n))
    usages = tuple(np.zeros(2, dtype=np.int64) for _ in range(n))
    edges = np.array([[i, (i + 1) % n] for i in range(n)] + [[i, (i + 3) % n] for i in range(0, n, 2)])
    return Problem(costs, usages, np.array([[0, 1]] * n), edges,
                   tuple(np.eye(2, dtype=np.int64) * 100 for _ in edges))
