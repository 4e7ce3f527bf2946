"""A first plan that chooses nothing forbidden, found in a fraction of a second where forbidden
pairs are dense.

The smallest-usage choices fit in memory whenever anything does, but where most entries of the
edge matrices are forbidden they break thousands of pairs, and the relaxation's decodes break
none yet overload memory until the multipliers have risen for several rounds. Here the two are
combined: a TRW-S decode of the problem whose only costs are memory (each strategy's usage above
the node's smallest, times the rows it is live on) and forbidden choices, with the true costs as a
tie-break far below one byte. Its answer uses little memory and, messages having carried the
forbidden pairs across hubs and chains, breaks few or no pairs.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from autoshard.solver.contraction import Contraction
from autoshard.solver.flat import FORBIDDEN, FlatProblem
from autoshard.solver.lagrange import Relaxation
from autoshard.solver.search import Search, forbidden_nodes

# The true costs of a whole answer, scaled by this over the largest single cost, stay far below
# one unit of usage-times-rows: they only break ties among choices of equal memory.
TIE_BREAK = 1e-6


def memory_problem(fp: FlatProblem) -> FlatProblem:
    """`fp` without memory rows, each strategy costing its usage times the rows it is live on,
    forbidden choices kept forbidden, true costs as a tie-break."""
    node_of = np.repeat(np.arange(fp.n), fp.sizes())
    rows_live = (fp.r1 - fp.r0)[node_of].astype(np.float64)
    return _memory_costs(fp, fp.use * rows_live)


def merged_memory_problem(contraction: Contraction) -> FlatProblem:
    """`memory_problem` of the original problem, on its merged one-to-one groups: a merged
    strategy's usage is its original strategies' usages times the rows each is live on."""
    original = contraction.original
    return _memory_costs(contraction.fp, contraction.usage_costs((original.r1 - original.r0).astype(np.float64)))


def _memory_costs(fp: FlatProblem, usage: np.ndarray) -> FlatProblem:
    """`fp` without memory rows, strategies costing `usage`, forbidden choices kept forbidden,
    true costs as a tie-break."""
    allowed_cost = fp.cost[fp.cost < FORBIDDEN]
    allowed_mat = fp.mat[fp.mat < FORBIDDEN]
    largest = max(float(np.abs(allowed_cost).max(initial=0.0)), float(np.abs(allowed_mat).max(initial=0.0)), 1.0)
    scale = TIE_BREAK / largest
    cost = np.where(fp.cost >= FORBIDDEN, FORBIDDEN, usage + fp.cost * scale)
    mat = np.where(fp.mat >= FORBIDDEN, FORBIDDEN, fp.mat * scale)
    no_rows = np.zeros(fp.n, dtype=np.int64)
    return replace(fp, cost=cost, mat=mat, r0=no_rows, r1=no_rows, cap=np.zeros(0, dtype=np.int64),
                   row_steps=np.zeros(0, dtype=np.int64))


def low_memory_labelling(fp: FlatProblem, seed: int, passes: int, moves_per_centre: int, block: int,
                         contraction: Contraction | None = None) -> np.ndarray:
    """A low-memory answer of `fp` that avoids forbidden choices where message passing and tree
    moves can: the TRW-S decode of `memory_problem` after `passes` passes (of
    `merged_memory_problem` when `contraction` merges fp's one-to-one groups: its decode breaks
    none of their edges), then tree moves of blocks up to `block` nodes on the same costs, grown
    from its forbidden choices and their neighbours, `moves_per_centre` per such node. It may
    still break a few pairs or, rarely, overload a row: the caller checks."""
    plain = memory_problem(fp)
    if contraction is None:
        start = Relaxation(plain).run(passes)
    else:
        start = contraction.expand(Relaxation(merged_memory_problem(contraction)).run(passes))
    search = Search(plain, start, seed)
    bad = forbidden_nodes(fp, search.best_x)
    if len(bad):
        centres = fp.around(bad)
        search.tree_moves(moves_per_centre * len(centres), block, centres=centres)
    return search.best_x.copy()
