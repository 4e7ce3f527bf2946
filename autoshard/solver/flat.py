"""The solvers' working form of a Problem: flat numpy arrays, cleaned of what cannot matter.

- Forbidden strategies (cost >= FORBIDDEN_COST, or with every entry of some incident edge row
  forbidden) are dropped, unless that would leave a node with none; `orig` maps back.
- Parallel edges are summed into one, all-zero edges dropped; each edge is stored (u, v) with
  u < v, its matrix row-major over the kept strategies, as float64 (exact below 2**53; the exact
  integer cost of any answer is always recomputed from the Problem).
- Memory: usages never go negative, so a time step whose live set is contained in another
  step's live set can never be the binding one. Only the steps whose live set is maximal are kept
  ("rows": a run of steps between interval ends/starts that some interval starts and some
  interval ends). A node is live on a contiguous range of rows `[r0, r1)`. Each node's smallest
  usage is moved into the rows' base load, so `use` holds only the part a choice can change and
  `cap[r] = usage_limit - base[r]`.
- Rows that cannot bind are dropped (`prune_rows`): a row whose load stays within its capacity
  even with every live node at its largest usage, and a row whose live set is contained in a
  neighbouring row's with no smaller capacity. A plan that fits on a 80 GB device with room to
  spare keeps no row at all, and no solver pays for its rows.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import NamedTuple

import numpy as np
from numba import njit

from autoshard.solver.problem import FORBIDDEN_COST, Problem

FORBIDDEN = float(FORBIDDEN_COST)


class FlatArrays(NamedTuple):
    """A FlatProblem's arrays (see its fields) as one record that compiled kernels take as an argument."""
    soff: np.ndarray
    cost: np.ndarray
    use: np.ndarray
    eu: np.ndarray
    ev: np.ndarray
    moff: np.ndarray
    mat: np.ndarray
    aoff: np.ndarray
    anbr: np.ndarray
    aedge: np.ndarray
    arow: np.ndarray
    r0: np.ndarray
    r1: np.ndarray
    cap: np.ndarray


@dataclass(frozen=True, eq=False)
class FlatProblem:
    n: int
    soff: np.ndarray      # int64[n+1]: strategies of node v are soff[v]:soff[v+1]
    orig: np.ndarray      # int64[S]: original strategy index of each kept strategy
    cost: np.ndarray      # float64[S]
    use: np.ndarray       # int64[S]: usage above the node's smallest usage
    eu: np.ndarray        # int64[m]
    ev: np.ndarray        # int64[m]
    moff: np.ndarray      # int64[m+1]: edge e's matrix is mat[moff[e]:moff[e+1]], |S_u| x |S_v| row-major
    mat: np.ndarray       # float64[M]
    aoff: np.ndarray      # int64[n+1]: adjacency of v is aoff[v]:aoff[v+1]
    anbr: np.ndarray      # int64[2m]: the neighbour
    aedge: np.ndarray     # int64[2m]: the edge
    arow: np.ndarray      # int8[2m]: 1 if v is the edge's row node (eu), 0 if its column node
    r0: np.ndarray        # int64[n]: first memory row of v
    r1: np.ndarray        # int64[n]: one past the last memory row of v (r0 == r1: v never binds)
    cap: np.ndarray       # int64[R]: usage_limit minus the rows' base load
    row_steps: np.ndarray  # int64[R]: the time step of each row

    @property
    def m(self) -> int:
        return len(self.eu)

    @property
    def num_rows(self) -> int:
        return len(self.cap)

    def sizes(self) -> np.ndarray:
        return np.diff(self.soff)

    @cached_property
    def arrays(self) -> FlatArrays:
        """The arrays for the compiled kernels, built once."""
        return FlatArrays(self.soff, self.cost, self.use, self.eu, self.ev, self.moff, self.mat, self.aoff,
                          self.anbr, self.aedge, self.arow, self.r0, self.r1, self.cap)

    @cached_property
    def shared_matrices(self) -> tuple[np.ndarray, np.ndarray]:
        """(start, entries): the edge matrices with each distinct one stored once, edge e's
        row-major from entries[start[e]]. The message passes read every entry of every edge;
        a training step's identical layers repeat a few dozen matrices tens of thousands of
        times, and the distinct ones stay in the processor's caches."""
        return _shared_layout(self.moff, self.mat)

    def to_original(self, x: np.ndarray) -> np.ndarray:
        """Original strategy indices of a solution in kept-strategy indices."""
        return self.orig[self.soff[:-1] + np.asarray(x, dtype=np.int64)]

    def from_original(self, solution: np.ndarray) -> np.ndarray:
        """Kept-strategy indices of an original solution; a dropped strategy maps to the node's first."""
        x = np.zeros(self.n, dtype=np.int64)
        for v, s in enumerate(np.asarray(solution, dtype=np.int64).tolist()):
            hits = np.flatnonzero(self.orig[self.soff[v]:self.soff[v + 1]] == s)
            x[v] = hits[0] if len(hits) else 0
        return x

    def objective(self, x: np.ndarray, cost: np.ndarray | None = None) -> float:
        """Cost of a solution (kept-strategy indices) in float arithmetic, with `cost` for the
        node costs when given (penalised ones)."""
        x = np.asarray(x, dtype=np.int64)
        total = float((self.cost if cost is None else cost)[self.soff[:-1] + x].sum())
        sizes = self.sizes()
        if self.m:
            total += float(self.mat[self.moff[:-1] + x[self.eu] * sizes[self.ev] + x[self.ev]].sum())
        return total

    def row_load(self, x: np.ndarray) -> np.ndarray:
        """Variable memory load of each row under solution x."""
        x = np.asarray(x, dtype=np.int64)
        delta = np.zeros(self.num_rows + 1, dtype=np.int64)
        use = self.use[self.soff[:-1] + x]
        np.add.at(delta, self.r0, use)
        np.add.at(delta, self.r1, -use)
        return np.cumsum(delta[:-1])

    def fits(self, x: np.ndarray) -> bool:
        return bool(np.all(self.row_load(x) <= self.cap))

    def around(self, nodes: np.ndarray) -> np.ndarray:
        """`nodes` and their neighbours, sorted, each once."""
        nodes = np.asarray(nodes, dtype=np.int64)
        counts = self.aoff[nodes + 1] - self.aoff[nodes]
        starts = np.repeat(self.aoff[nodes] - np.cumsum(counts) + counts, counts)
        return np.union1d(nodes, self.anbr[starts + np.arange(int(counts.sum()))])


def _maximal_steps(intervals: np.ndarray) -> np.ndarray:
    """First steps of the runs of steps whose live set is maximal (not inside another step's).

    Between consecutive interval ends/starts the live set is constant; such a run [p, q) is
    maximal iff some interval starts at p and some interval ends at q."""
    live = intervals[:, 0] < intervals[:, 1]
    starts = np.unique(intervals[live, 0])
    ends = np.unique(intervals[live, 1])
    points = np.union1d(starts, ends)
    if len(points) < 2:
        return np.zeros(0, dtype=np.int64)
    maximal = np.isin(points[:-1], starts) & np.isin(points[1:], ends)
    return points[:-1][maximal].astype(np.int64)


def _keep_mask(soff: np.ndarray, costs: np.ndarray, eu: np.ndarray, ev: np.ndarray, mstart: np.ndarray,
               entries: np.ndarray) -> np.ndarray:
    """Per strategy (flat over the nodes' offsets `soff`), whether it is worth keeping: not
    forbidden alone nor by a fully forbidden edge row among the kept strategies across an edge
    (edge e joins eu[e] and ev[e], its matrix starts at entries[mstart[e]], row-major)."""
    keep = costs < FORBIDDEN_COST
    none_left = ~np.logical_or.reduceat(keep, soff[:-1])
    keep[np.repeat(none_left, np.diff(soff))] = True
    if len(eu):
        _arc_consistency(keep, soff, eu, ev, mstart, entries < FORBIDDEN_COST)
    return keep


@njit(cache=True, nogil=True)
def _arc_consistency(keep: np.ndarray, soff: np.ndarray, eu: np.ndarray, ev: np.ndarray, mstart: np.ndarray,
                     allowed: np.ndarray) -> None:
    """Drop, edge by edge until nothing changes, the strategies with no allowed partner among the
    kept strategies across an edge, unless that would leave a node none (in place)."""
    changed = True
    while changed:
        changed = False
        for e in range(len(eu)):
            u, v = eu[e], ev[e]
            rows, columns = soff[u + 1] - soff[u], soff[v + 1] - soff[v]
            row_ok = np.zeros(rows, dtype=np.bool_)
            column_ok = np.zeros(columns, dtype=np.bool_)
            for i in range(rows):
                for j in range(columns):
                    if allowed[mstart[e] + i * columns + j]:
                        row_ok[i] |= keep[soff[v] + j]
                        column_ok[j] |= keep[soff[u] + i]
            for node, ok in ((u, row_ok), (v, column_ok)):
                mine = keep[soff[node]:soff[node + 1]]
                new = mine & ok
                if new.any() and not np.array_equal(new, mine):
                    mine[:] = new
                    changed = True


def flatten(problem: Problem) -> FlatProblem:
    """The working form of `problem` (see the module docstring)."""
    n = problem.num_nodes
    if n == 0:
        return _empty()
    m = problem.num_edges
    edge_u = np.ascontiguousarray(problem.edges[:, 0], dtype=np.int64) if m else np.zeros(0, dtype=np.int64)
    edge_v = np.ascontiguousarray(problem.edges[:, 1], dtype=np.int64) if m else np.zeros(0, dtype=np.int64)
    edge_start, entries = _shared_entries(problem.edge_costs)
    return flatten_arrays(problem.num_strategies(), np.concatenate(problem.node_costs),
                          np.concatenate(problem.node_usages), problem.intervals, problem.usage_limit,
                          edge_u, edge_v, edge_start, entries)


def flatten_arrays(original_sizes: np.ndarray, costs: np.ndarray, usages: np.ndarray, intervals: np.ndarray,
                   usage_limit: int | None, edge_u: np.ndarray, edge_v: np.ndarray, edge_start: np.ndarray,
                   entries: np.ndarray) -> FlatProblem:
    """`flatten` of a valid problem given as arrays: strategies per node, every node's costs and
    usages one after the other, its (n, 2) intervals, the edges' ends and where each edge's
    row-major matrix starts in `entries` (int64 costs, as in a Problem)."""
    n = len(original_sizes)
    original_soff = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(original_sizes, out=original_soff[1:])
    keep = _keep_mask(original_soff, costs, edge_u, edge_v, edge_start, entries)
    kept_flat = np.flatnonzero(keep)
    node_of = np.repeat(np.arange(n), original_sizes)[kept_flat]
    sizes = np.bincount(node_of, minlength=n).astype(np.int64)
    soff = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(sizes, out=soff[1:])
    orig = kept_flat - original_soff[node_of]
    cost = costs[kept_flat].astype(np.float64)
    usage = usages[kept_flat]
    base_use = np.minimum.reduceat(usage, soff[:-1])  # every node keeps a strategy
    use = (usage - base_use[node_of]).astype(np.int64)
    spread = np.maximum.reduceat(usage, soff[:-1]) - base_use

    eu, ev, moff, mat = _merged_edges(original_soff, soff, orig, edge_u, edge_v, edge_start, entries)

    ends = np.concatenate([eu, ev])
    order = np.argsort(ends, kind="stable")
    aoff = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(ends, minlength=n), out=aoff[1:])
    edge_ids = np.concatenate([np.arange(len(eu)), np.arange(len(eu))])
    anbr = np.concatenate([ev, eu])[order]
    aedge = edge_ids[order]
    arow = np.concatenate([np.ones(len(eu), np.int8), np.zeros(len(eu), np.int8)])[order]

    if usage_limit is None:
        steps = np.zeros(0, dtype=np.int64)
    else:
        steps = _maximal_steps(intervals)
    r0 = np.searchsorted(steps, intervals[:, 0]).astype(np.int64)
    r1 = np.maximum(np.searchsorted(steps, intervals[:, 1]).astype(np.int64), r0)
    delta = np.zeros(len(steps) + 1, dtype=np.int64)
    np.add.at(delta, r0, base_use)
    np.add.at(delta, r1, -base_use)
    base = np.cumsum(delta[:-1])
    cap = (usage_limit - base) if len(steps) else np.zeros(0, dtype=np.int64)
    # A node whose usage cannot change never binds: give it an empty row range.
    r1 = np.where(spread > 0, r1, r0)
    r0, r1, cap, steps = prune_rows(r0, r1, spread, np.asarray(cap, dtype=np.int64), steps)
    r0, r1, cap, steps = merge_rows(r0, r1, cap, steps)
    return FlatProblem(n=n, soff=soff, orig=orig, cost=cost, use=use, eu=eu, ev=ev, moff=moff, mat=mat,
                       aoff=aoff, anbr=anbr, aedge=aedge, arow=arow, r0=r0, r1=r1, cap=cap, row_steps=steps)


def _empty() -> FlatProblem:
    """The working form of a problem without nodes."""
    ints = np.zeros(0, dtype=np.int64)
    return FlatProblem(n=0, soff=np.zeros(1, dtype=np.int64), orig=ints, cost=np.zeros(0), use=ints, eu=ints,
                       ev=ints, moff=np.zeros(1, dtype=np.int64), mat=np.zeros(0), aoff=np.zeros(1, dtype=np.int64),
                       anbr=ints, aedge=ints, arow=np.zeros(0, dtype=np.int8), r0=ints, r1=ints, cap=ints,
                       row_steps=ints)


def _shared_entries(matrices: tuple[np.ndarray, ...]) -> tuple[np.ndarray, np.ndarray]:
    """The edge matrices' entries, each matrix object once (a formulation shares one matrix among
    the edges of identical layers: 82 matrices for the 44k edges of a 96-layer 3-D training step),
    and where each edge's matrix starts in them (row-major from there)."""
    start_of: dict[int, int] = {}
    distinct: list[np.ndarray] = []
    starts = np.empty(len(matrices), dtype=np.int64)
    end = 0
    for e, matrix in enumerate(matrices):
        start = start_of.get(id(matrix))
        if start is None:
            start = start_of[id(matrix)] = end
            distinct.append(matrix.ravel())
            end += matrix.size
        starts[e] = start
    return starts, (np.concatenate(distinct) if distinct else np.zeros(0, dtype=np.int64))


def _shared_layout(moff: np.ndarray, mat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Edge matrices (contiguous, edge e's at mat[moff[e]:moff[e+1]]) with equal ones stored once:
    matrices group by a hash of their bytes and length, and each is compared with its group's
    first before it shares its entries."""
    m = len(moff) - 1
    if m == 0:
        return moff[:-1].copy(), mat
    digest = _matrix_hashes(moff, mat.view(np.int64))
    keys = np.stack([digest, np.diff(moff)], axis=1)
    _, first, group = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    representative = first[group.reshape(-1)]
    equal = _equal_matrices(moff, mat, representative)
    representative = np.where(equal, representative, np.arange(m))  # a hash collision keeps its own copy
    stored = np.unique(representative)
    sizes = np.diff(moff)[stored]
    new_start = np.zeros(len(stored), dtype=np.int64)
    np.cumsum(sizes[:-1], out=new_start[1:])
    entries = np.concatenate([mat[moff[e]:moff[e + 1]] for e in stored.tolist()])
    start = new_start[np.searchsorted(stored, representative)]
    return start, entries


@njit(cache=True, nogil=True)
def _matrix_hashes(moff: np.ndarray, bits: np.ndarray) -> np.ndarray:
    """A 64-bit FNV-1a-style hash of each edge matrix's entries (as their float64 bit patterns)."""
    m = len(moff) - 1
    out = np.empty(m, dtype=np.int64)
    for e in range(m):
        h = np.uint64(14695981039346656037)
        for k in range(moff[e], moff[e + 1]):
            h = (h ^ np.uint64(bits[k])) * np.uint64(1099511628211)
        out[e] = np.int64(h)
    return out


@njit(cache=True, nogil=True)
def _equal_matrices(moff: np.ndarray, mat: np.ndarray, representative: np.ndarray) -> np.ndarray:
    """Whether each edge's matrix equals its representative's (of the same length), entry for
    entry (bit patterns: the hashes were of bits)."""
    m = len(moff) - 1
    out = np.ones(m, dtype=np.bool_)
    bits = mat.view(np.int64)
    for e in range(m):
        r = representative[e]
        if r == e:
            continue
        for k in range(moff[e + 1] - moff[e]):
            if bits[moff[e] + k] != bits[moff[r] + k]:
                out[e] = False
                break
    return out


def _merged_edges(original_soff: np.ndarray, soff: np.ndarray, orig: np.ndarray, edge_u: np.ndarray,
                  edge_v: np.ndarray, edge_start: np.ndarray, entries: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The edges as (u < v) pairs sorted, parallel edges summed (capped at FORBIDDEN) in their
    order of appearance, all-zero ones dropped: eu, ev, moff and the float64 matrices over the
    kept strategies (`orig`) concatenated row-major."""
    if len(edge_u) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(1, dtype=np.int64), np.zeros(0)
    low, high = np.minimum(edge_u, edge_v), np.maximum(edge_u, edge_v)
    order = np.lexsort((high, low))  # stable: parallel edges stay in their order of appearance
    low, high = low[order], high[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = (low[1:] != low[:-1]) | (high[1:] != high[:-1])
    group_start = np.flatnonzero(first)
    pair_u, pair_v = low[group_start], high[group_start]
    sizes = np.diff(soff)
    pair_off = np.zeros(len(group_start) + 1, dtype=np.int64)
    np.cumsum(sizes[pair_u] * sizes[pair_v], out=pair_off[1:])
    # Written compacted, all-zero pairs overwritten by the next: the tail past the last nonzero
    # pair is never touched (copying a compacted 165M entries took seconds).
    mat = np.empty(pair_off[-1], dtype=np.float64)
    group_end = np.append(group_start[1:], len(order))
    nonzero = _fill_merged(order, group_start, group_end, edge_u, edge_v, edge_start, entries, original_soff, soff,
                           orig, pair_off, mat)
    kept_sizes = np.diff(pair_off)[nonzero]
    moff = np.zeros(len(kept_sizes) + 1, dtype=np.int64)
    np.cumsum(kept_sizes, out=moff[1:])
    return pair_u[nonzero], pair_v[nonzero], moff, mat[:moff[-1]]


@njit(cache=True, nogil=True)
def _fill_merged(order: np.ndarray, group_start: np.ndarray, group_end: np.ndarray, edge_u: np.ndarray,
                 edge_v: np.ndarray, edge_start: np.ndarray, entries: np.ndarray, original_soff: np.ndarray,
                 soff: np.ndarray, orig: np.ndarray, pair_off: np.ndarray, mat: np.ndarray) -> np.ndarray:
    """Writes the summed matrices of the pairs with a nonzero entry one after the other from
    mat[0] (`pair_off` sizes each pair's, nonzero or not); returns which pairs have one."""
    nonzero = np.zeros(len(group_start), dtype=np.bool_)
    out = 0
    for p in range(len(group_start)):
        for k in range(group_start[p], group_end[p]):
            e = order[k]
            u, v = edge_u[e], edge_v[e]
            low, high = min(u, v), max(u, v)
            columns = original_soff[v + 1] - original_soff[v]
            width = soff[high + 1] - soff[high]
            for i in range(soff[low], soff[low + 1]):
                cell = out + (i - soff[low]) * width
                for j in range(soff[high], soff[high + 1]):
                    if u <= v:
                        value = float(entries[edge_start[e] + orig[i] * columns + orig[j]])
                    else:
                        value = float(entries[edge_start[e] + orig[j] * columns + orig[i]])
                    mat[cell] = value if k == group_start[p] else min(mat[cell] + value, FORBIDDEN)
                    cell += 1
        size = pair_off[p + 1] - pair_off[p]
        for cell in range(out, out + size):
            if mat[cell] != 0.0:
                nonzero[p] = True
                break
        if nonzero[p]:
            out += size
    return nonzero

def row_load(r0: np.ndarray, r1: np.ndarray, per_node: np.ndarray, num_rows: int) -> np.ndarray:
    """Per row, the sum of `per_node` over the nodes live on it (a node covers rows [r0, r1))."""
    delta = np.zeros(num_rows + 1, dtype=np.int64)
    np.add.at(delta, r0, per_node)
    np.add.at(delta, r1, -per_node)
    return np.cumsum(delta[:-1])


def _keep_rows(keep: np.ndarray, r0: np.ndarray, r1: np.ndarray, cap: np.ndarray, steps: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Only the rows `keep` marks. A node's range becomes the kept rows inside it, still contiguous
    because kept rows keep their order: [r0, r1) -> [kept before r0, kept before r1)."""
    before = np.concatenate([[0], np.cumsum(keep)]).astype(np.int64)
    return before[r0], before[r1], cap[keep], steps[keep]


def _dominated_rows(r0: np.ndarray, r1: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """Rows whose live set is inside a neighbouring row's whose capacity is no larger: that row
    is overloaded whenever this one is. With equal live sets and capacities only the left row of
    the two goes, so every dropped row leads, row by row in one direction, to a kept row that
    implies it."""
    num_rows = len(cap)
    spans = r1 > r0
    starts = np.zeros(num_rows + 1, dtype=bool)
    ends = np.zeros(num_rows + 1, dtype=bool)
    starts[r0[spans]] = True
    ends[r1[spans]] = True
    inside_next = ~ends[1:num_rows]      # row r's set within row r+1's: nothing ends at r+1
    inside_prev = ~starts[1:num_rows]    # row r+1's set within row r's: nothing starts at r+1
    same = inside_next & inside_prev
    dominated = np.zeros(num_rows, dtype=bool)
    dominated[:-1] |= inside_next & (cap[:-1] >= cap[1:])
    dominated[1:] |= inside_prev & ~same & (cap[1:] >= cap[:-1])
    dominated[1:] |= same & (cap[1:] > cap[:-1])
    return dominated


def prune_rows(r0: np.ndarray, r1: np.ndarray, spread: np.ndarray, cap: np.ndarray, steps: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Drop the rows no choice can overload (`spread[v]`: node v's largest usage above its
    smallest), then, until none is left, the rows a neighbouring row implies. Rows that always
    overflow (negative capacity, nothing live) stay."""
    keep = row_load(r0, r1, spread, len(cap)) > cap
    r0, r1, cap, steps = _keep_rows(keep, r0, r1, cap, steps)
    while len(cap) > 1:
        dominated = _dominated_rows(r0, r1, cap)
        if not dominated.any():
            break
        r0, r1, cap, steps = _keep_rows(~dominated, r0, r1, cap, steps)
    return r0, r1, cap, steps


def merge_rows(r0: np.ndarray, r1: np.ndarray, cap: np.ndarray, steps: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Merge consecutive rows over the same live nodes into one with the smallest capacity.

    Nodes with an empty range keep `r0 == r1 == 0`. Rows no node spans are dropped unless
    their capacity is negative (then no solution fits, and the row says so)."""
    spans = r1 > r0
    cuts = np.unique(np.concatenate([r0[spans], r1[spans]]))
    if len(cap) == 0:
        return np.zeros_like(r0), np.zeros_like(r1), cap, steps
    if len(cuts) == 0:
        cuts = np.array([0, len(cap)], dtype=np.int64)
    segment_cap = np.minimum.reduceat(cap, cuts[:-1]) if len(cuts) > 1 else np.zeros(0, dtype=np.int64)
    outside = np.ones(len(cap), dtype=bool)
    outside[cuts[0]:cuts[-1]] = False
    broken = np.flatnonzero(outside & (cap < 0))
    new_r0 = np.where(spans, np.searchsorted(cuts, r0), 0)
    new_r1 = np.where(spans, np.searchsorted(cuts, r1), 0)
    new_cap = np.concatenate([segment_cap, cap[broken]])
    new_steps = np.concatenate([steps[cuts[:-1]], steps[broken]]) if len(steps) else steps
    return new_r0.astype(np.int64), new_r1.astype(np.int64), new_cap.astype(np.int64), new_steps


def only_rows(fp: FlatProblem, keep: np.ndarray) -> FlatProblem:
    """fp with only the memory rows `keep` marks. Every answer of fp is one of the result, so the
    result's optimum bounds fp's from below."""
    r0, r1, cap, steps = _keep_rows(np.asarray(keep, dtype=bool), fp.r0, fp.r1, fp.cap, fp.row_steps)
    return replace(fp, r0=r0, r1=r1, cap=cap, row_steps=steps)


def only_steps(fp: FlatProblem, first: int, end: int) -> FlatProblem:
    """fp with only the memory rows of the time steps in [first, end) (a row stands for a run of
    steps with the same live nodes; it is kept if the run starts there)."""
    return only_rows(fp, (fp.row_steps >= first) & (fp.row_steps < end))
