"""Nodes tied by one-to-one edges, merged for the relaxation.

An edge whose allowed pairs (entries below FORBIDDEN) form a one-to-one map between its two
nodes' strategies forces each node's choice from the other's: any answer that chooses nothing
forbidden picks matching strategies. The contest's "crosscut" instances are full of them (C:
22,002 of its 34,742 edges, tying 22,158 of 32,894 nodes into 156 groups of up to 1,656), and
message passing over such chains and their cycles converges slowly and decodes into forbidden
pairs. Merged, each group is one node whose strategies are its root's (the others follow through
the maps), the edges inside it become node costs, and what is left is small and nearly a forest:
C becomes 10,892 nodes and 2,649 edges.

The merged problem has no memory rows: the relaxation adds each original node's penalised usage
to the strategy it maps to (`Contraction.penalised_costs`), so its minimum under any multipliers
is the original's minimum over answers that break no one-to-one edge, and its bound holds for
every answer that chooses nothing forbidden.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from autoshard.solver.flat import FORBIDDEN, FlatProblem, flatten_arrays

# Merging pays where it removes a large share of the nodes (C: 67%, A: 80%); where it would remove
# a few percent (N-crosscut: 175 of 40,958 nodes) the messages would run much as before, after a
# second spent merging.
MERGED_NODES_AT_MOST = 0.8


@njit(cache=True)
def _one_to_one(soff: np.ndarray, eu: np.ndarray, ev: np.ndarray, moff: np.ndarray, mat: np.ndarray,
                forbidden: float) -> tuple[np.ndarray, np.ndarray]:
    """Per edge whether its allowed pairs map the strategies one-to-one and, for those, the
    column strategy matched with each row strategy (at moff[e] + row; other entries -1)."""
    m = eu.shape[0]
    tied = np.zeros(m, dtype=np.bool_)
    match = np.full(mat.shape[0], -1, dtype=np.int64)
    for e in range(m):
        rows = soff[eu[e] + 1] - soff[eu[e]]
        cols = soff[ev[e] + 1] - soff[ev[e]]
        if rows != cols or rows < 2:
            continue
        hit = np.zeros(cols, dtype=np.int64)
        ok = True
        for a in range(rows):
            found = -1
            for b in range(cols):
                if mat[moff[e] + a * cols + b] < forbidden:
                    if found >= 0:
                        ok = False
                        break
                    found = b
            if not ok or found < 0 or hit[found]:
                ok = False
                break
            hit[found] = 1
            match[moff[e] + a] = found
        tied[e] = ok
    return tied, match


@njit(cache=True)
def _groups(soff: np.ndarray, eu: np.ndarray, aoff: np.ndarray, anbr: np.ndarray, aedge: np.ndarray,
            moff: np.ndarray, tied: np.ndarray, match: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Groups of nodes connected by tied edges, breadth first from their lowest node (the root):
    each node's group, the roots in group order, and per node the strategy that follows each
    root strategy (at soff[v] + root strategy), composed along the search tree."""
    n = soff.shape[0] - 1
    group = np.full(n, -1, dtype=np.int64)
    follow = np.empty(soff[n], dtype=np.int64)
    roots = np.empty(n, dtype=np.int64)
    queue = np.empty(n, dtype=np.int64)
    groups = 0
    for root in range(n):
        if group[root] >= 0:
            continue
        roots[groups] = root
        group[root] = groups
        k = soff[root + 1] - soff[root]
        for s in range(k):
            follow[soff[root] + s] = s
        head, tail = 0, 1
        queue[0] = root
        while head < tail:
            a = queue[head]
            head += 1
            for i in range(aoff[a], aoff[a + 1]):
                b, e = anbr[i], aedge[i]
                if not tied[e] or group[b] >= 0:
                    continue
                group[b] = groups
                queue[tail] = b
                tail += 1
                if eu[e] == a:  # a is the row node: its strategy maps forwards
                    for s in range(k):
                        follow[soff[b] + s] = match[moff[e] + follow[soff[a] + s]]
                else:  # a is the column node: invert the map
                    for s in range(k):
                        wanted = follow[soff[a] + s]
                        for r in range(k):
                            if match[moff[e] + r] == wanted:
                                follow[soff[b] + s] = r
                                break
        groups += 1
    return group, roots[:groups], follow


@dataclass(frozen=True, eq=False)
class Contraction:
    """A FlatProblem with its one-to-one groups merged (`fp`: costs without penalties, no memory
    rows), and the maps between the two."""

    fp: FlatProblem
    group: np.ndarray        # int64[n]: each original node's merged node
    follow: np.ndarray       # int64[S]: original node v's strategy for root strategy s at soff[v] + s
    strategy_of: np.ndarray  # int64[S]: each original strategy's merged strategy (-1: dropped as forbidden)
    original: FlatProblem

    def expand(self, merged_x: np.ndarray) -> np.ndarray:
        """The original answer of a merged one."""
        fp, soff = self.fp, self.original.soff
        root_strategy = fp.orig[fp.soff[:-1] + np.asarray(merged_x, dtype=np.int64)]
        return self.follow[soff[:-1] + root_strategy[self.group]]

    def penalised_costs(self, pen: np.ndarray) -> np.ndarray:
        """The merged strategies' costs plus every original node's `pen * use` on them."""
        return self.fp.cost + self.usage_costs(pen)

    def usage_costs(self, pen: np.ndarray) -> np.ndarray:
        """Per merged strategy, the sum of its original strategies' `pen[node] * use`."""
        original = self.original
        node_of = np.repeat(np.arange(original.n), original.sizes())
        weights = pen[node_of] * original.use
        kept = self.strategy_of >= 0
        return np.bincount(self.strategy_of[kept], weights=weights[kept], minlength=len(self.fp.cost))


def contract(fp: FlatProblem) -> Contraction | None:
    """`fp` with its one-to-one groups merged, or None when nothing is tied or merging would leave
    more than `MERGED_NODES_AT_MOST` of its nodes."""
    if fp.m == 0:
        return None
    tied, match = _one_to_one(fp.soff, fp.eu, fp.ev, fp.moff, fp.mat, FORBIDDEN)
    if not tied.any() or fp.n - int(tied.sum()) > MERGED_NODES_AT_MOST * fp.n:  # a tie merges two groups at most
        return None
    group, roots, follow = _groups(fp.soff, fp.eu, fp.aoff, fp.anbr, fp.aedge, fp.moff, tied, match)
    if len(roots) > MERGED_NODES_AT_MOST * fp.n:
        return None
    sizes = fp.sizes()
    k = sizes[roots]
    goff = np.zeros(len(roots) + 1, dtype=np.int64)
    np.cumsum(k, out=goff[1:])
    node_of = np.repeat(np.arange(fp.n), sizes)
    root_strategy = np.arange(len(follow)) - fp.soff[node_of]  # position s in follow's layout
    # Node costs: every member's cost of the strategy that follows each root strategy ...
    cost = np.zeros(goff[-1], dtype=np.float64)
    np.add.at(cost, goff[group[node_of]] + root_strategy, fp.cost[fp.soff[node_of] + follow])
    # ... plus the edges inside a group, at the pairs that follow each root strategy.
    inside = np.flatnonzero(group[fp.eu] == group[fp.ev])
    if len(inside):
        count = sizes[fp.eu[inside]]
        e = np.repeat(inside, count)
        s = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
        u_pick, v_pick = follow[fp.soff[fp.eu[e]] + s], follow[fp.soff[fp.ev[e]] + s]
        np.add.at(cost, goff[group[fp.eu[e]]] + s, fp.mat[fp.moff[e] + u_pick * sizes[fp.ev[e]] + v_pick])
    # Edges between groups: entry (s, t) is the original's at the strategies following s and t.
    between = np.flatnonzero(group[fp.eu] != group[fp.ev])
    rows, cols = sizes[fp.eu[between]], sizes[fp.ev[between]]
    count = rows * cols
    e = np.repeat(between, count)
    cols_e = np.repeat(cols, count)
    entry = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
    s, t = entry // cols_e, entry % cols_e
    values = fp.mat[fp.moff[e] + follow[fp.soff[fp.eu[e]] + s] * cols_e + follow[fp.soff[fp.ev[e]] + t]]
    merged = flatten_arrays(k, _capped(cost), np.zeros(goff[-1], dtype=np.int64), np.zeros((len(roots), 2), dtype=np.int64),
                            None, group[fp.eu[between]], group[fp.ev[between]], np.cumsum(count) - count, _capped(values))
    # Each original strategy's merged strategy: its root strategy's kept index in the merged node.
    position = np.full(goff[-1], -1, dtype=np.int64)
    merged_node = np.repeat(np.arange(merged.n), merged.sizes())
    position[goff[merged_node] + merged.orig] = np.arange(len(merged.orig))
    inverse = np.empty_like(follow)
    inverse[fp.soff[node_of] + follow] = root_strategy
    strategy_of = position[goff[group[node_of]] + inverse]
    return Contraction(merged, group, follow, strategy_of, fp)


def _capped(values: np.ndarray) -> np.ndarray:
    """Summed costs as int64, forbidden sums at FORBIDDEN (a group's sum of many could overflow)."""
    return np.minimum(values, FORBIDDEN).astype(np.int64)
