"""Descent within the current usages: a large move that can never break a memory row.

Keep, at every node that takes part in some memory row, only the strategies that use no more
memory than its current choice. Whatever the rest of the problem picks among those, every row's
load stays at or below its current load, so the memory rows can be dropped and the remaining
unconstrained problem is solved by TRW-S and tree moves, which are strong without rows.

Such a move changes thousands of nodes at once when the memory limit forces a whole family of
nodes (a layer's activations, say) to one sharding and a cheaper consistent choice of the
family exists that uses no more memory: small CP-SAT neighbourhoods cannot reach it, because
every partial change pays resharding on its border.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from numba import njit

from autoshard.solver.flat import FlatProblem
from autoshard.solver.lagrange import Relaxation
from autoshard.solver.search import Search


def keep_strategies(fp: FlatProblem, keep: np.ndarray) -> FlatProblem:
    """`fp` with only the strategies where `keep` (one flag per strategy) holds; each node must
    keep one at least. `orig` of the result is the strategy's index in `fp`, so `to_original`
    maps an answer back to `fp`'s indices."""
    keep = np.asarray(keep, dtype=bool)
    sizes = fp.sizes()
    node_of = np.repeat(np.arange(fp.n), sizes)
    new_sizes = np.bincount(node_of[keep], minlength=fp.n)
    if np.any(new_sizes == 0):
        raise ValueError("keep_strategies: every node must keep at least one strategy")
    soff = np.zeros(fp.n + 1, dtype=np.int64)
    np.cumsum(new_sizes, out=soff[1:])
    local = np.arange(len(keep)) - fp.soff[node_of]
    moff = np.zeros(fp.m + 1, dtype=np.int64)
    np.cumsum(new_sizes[fp.eu] * new_sizes[fp.ev], out=moff[1:])
    mat = _kept_entries(keep, fp.soff, fp.eu, fp.ev, fp.moff, fp.mat, moff)
    return replace(fp, soff=soff, orig=local[keep], cost=fp.cost[keep], use=fp.use[keep], moff=moff, mat=mat)


@njit(cache=True, nogil=True)
def _kept_entries(keep: np.ndarray, soff: np.ndarray, eu: np.ndarray, ev: np.ndarray, moff: np.ndarray,
                  mat: np.ndarray, new_moff: np.ndarray) -> np.ndarray:
    """The entries of every edge matrix whose row and column strategies are both kept, row-major
    (a 96-layer 3-D training step has 165M entries: index arrays over all of them took 18 s)."""
    out = np.empty(new_moff[-1], dtype=mat.dtype)
    for e in range(len(eu)):
        u, v = eu[e], ev[e]
        columns = soff[v + 1] - soff[v]
        k = new_moff[e]
        for i in range(soff[u + 1] - soff[u]):
            if keep[soff[u] + i]:
                row = moff[e] + i * columns
                for j in range(columns):
                    if keep[soff[v] + j]:
                        out[k] = mat[row + j]
                        k += 1
    return out


def within_usage(fp: FlatProblem, x: np.ndarray) -> FlatProblem:
    """The problem of the strategies that use no more memory than x's, without memory rows
    (nodes that take part in no row keep all their strategies)."""
    x = np.asarray(x, dtype=np.int64)
    node_of = np.repeat(np.arange(fp.n), fp.sizes())
    in_rows = (fp.r1 > fp.r0)[node_of]
    keep = ~in_rows | (fp.use <= fp.use[fp.soff[:-1] + x][node_of])
    no_rows = np.zeros(fp.n, dtype=np.int64)
    return replace(keep_strategies(fp, keep), r0=no_rows, r1=no_rows, cap=np.zeros(0, dtype=np.int64),
                   row_steps=np.zeros(0, dtype=np.int64))


def descend(fp: FlatProblem, x: np.ndarray, seed: int, passes: int = 10) -> np.ndarray:
    """A solution no more expensive than x whose every node uses no more memory than in x (so it
    fits wherever x fits): the better of x and a TRW-S decode of `within_usage` after tree moves."""
    sub = within_usage(fp, x)
    # The decode may still pick forbidden pairs here and there: tree moves clean them up.
    search = Search(sub, Relaxation(sub).run(passes), seed)
    search.tree_moves(max(2000, 2 * fp.n), 16)
    search.reset(_in_kept(fp, sub, x))
    return sub.to_original(search.best_x)


def _in_kept(fp: FlatProblem, kept: FlatProblem, x: np.ndarray) -> np.ndarray:
    """x (in fp's strategy indices) in the indices of `kept`, a `keep_strategies` of fp that keeps x."""
    node_of = np.repeat(np.arange(fp.n), kept.sizes())
    slot = np.full(len(fp.cost), -1, dtype=np.int64)
    slot[fp.soff[node_of] + kept.orig] = np.arange(len(kept.orig))
    return slot[fp.soff[:-1] + np.asarray(x, dtype=np.int64)] - kept.soff[:-1]
