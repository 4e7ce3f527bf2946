"""TRW-S message passing against a plain transcription of its update and decoding rules."""

import numpy as np
import pytest

from autoshard.solver import messages
from autoshard.solver.flat import flatten
from autoshard.solver.lagrange import Relaxation
from support.solver_problems import random_problem


def reference_passes(fp, pen, order, msg, msg_off, part, num_passes):
    """The passes written out per equation: returns the messages and each forward pass's decode."""
    rank = np.empty(fp.n, dtype=np.int64)
    rank[order] = np.arange(fp.n)
    sizes = fp.sizes()
    x = np.zeros(fp.n, dtype=np.int64)
    decodes = []

    def matrix(j):  # the edge of adjacency entry j, rows indexed by the strategies of its node
        e = fp.aedge[j]
        m = fp.mat[fp.moff[e]:fp.moff[e + 1]].reshape(sizes[fp.eu[e]], sizes[fp.ev[e]])
        return m if fp.arow[j] == 1 else m.T

    for p in range(2 * num_passes):
        forward = p % 2 == 0
        for v in (order if forward else order[::-1]):
            unary = fp.cost[fp.soff[v]:fp.soff[v + 1]] + pen[v] * fp.use[fp.soff[v]:fp.soff[v + 1]]
            entries = range(fp.aoff[v], fp.aoff[v + 1])
            belief = unary + sum((msg[msg_off[j]:msg_off[j + 1]] for j in entries), np.zeros(sizes[v]))
            if forward:
                decide = unary.copy()
                for j in entries:
                    w = fp.anbr[j]
                    decide = decide + (matrix(j)[:, x[w]] if rank[w] < rank[v] else msg[msg_off[j]:msg_off[j + 1]])
                x[v] = int(np.argmin(decide))
            before = sum(1 for j in entries if rank[fp.anbr[j]] < rank[v])
            gamma = 1.0 / max(1, before, len(entries) - before)
            for j in entries:
                w = fp.anbr[j]
                if (rank[w] > rank[v]) != forward:
                    continue
                head = gamma * belief - msg[msg_off[j]:msg_off[j + 1]]
                out = (head[:, None] + matrix(j)).min(axis=0)
                msg[msg_off[part[j]]:msg_off[part[j] + 1]] = out - out.min()
        if forward:
            decodes.append(x.copy())
    return msg, decodes


def penalised(fp, pen, x):
    return fp.objective(x) + float(pen @ fp.use[fp.soff[:-1] + x])


@pytest.mark.parametrize("seed", range(12))
def test_passes_match_the_equations_and_keep_the_cheapest_decode(seed):
    fp = flatten(random_problem(900 + seed, limited=True))
    relaxation = Relaxation(fp)
    rng = np.random.default_rng(seed)
    relaxation.lam = rng.uniform(0, 2, fp.num_rows)
    relaxation.order = rng.permutation(fp.n).astype(np.int64)
    relaxation.msg[:] = rng.uniform(-30, 30, len(relaxation.msg))  # far from converged: decodes differ
    pen = relaxation.penalties()
    expected_msg, decodes = reference_passes(fp, pen, relaxation.order, relaxation.msg.copy(), relaxation.msg_off,
                                             relaxation.part, num_passes=4)
    x = relaxation.run(4)
    assert np.allclose(relaxation.msg, expected_msg, rtol=1e-12, atol=1e-9)
    costs = [penalised(fp, pen, d) for d in decodes]
    assert penalised(fp, pen, x) == pytest.approx(min(costs))
    assert any(np.array_equal(x, d) for d in decodes)


def test_min_over_edge_reads_the_matrix_both_ways():
    mat = np.arange(6, dtype=np.float64)  # [[0, 1, 2], [3, 4, 5]]
    head = np.array([10.0, 0.0])
    msg = np.zeros(3)
    messages._min_over_edge(head, 2, mat, 0, 3, True, msg, 0)  # v's strategies index the rows
    assert np.array_equal(msg, np.array([3.0, 4.0, 5.0]) - 3.0)
    head = np.array([0.0, 10.0, 1.0])
    msg = np.zeros(2)
    messages._min_over_edge(head, 3, mat, 0, 2, False, msg, 0)  # ... or the columns
    assert np.array_equal(msg, np.array([0.0, 3.0]))
