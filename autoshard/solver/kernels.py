"""Compiled inner loops of the local search (numba), over one record of a FlatProblem's arrays.

Memory rows live in a segment tree over `slack[r] = load[r] - cap[r]` with range add and range
max, so a move's memory check costs O(log R). The main move re-optimises a random *induced
tree* of nodes exactly by dynamic programming, all other nodes fixed: the block grows from a
seed node, adding a neighbour only if it has exactly one edge into the block, so the block's
internal edges form a tree and the DP is exact for the block's cost. Memory enters the DP as a
per-node penalty on usage; a result that overloads a row is retried with larger penalties on
the offending nodes and, failing that, rejected.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from autoshard.solver.flat import FlatArrays

NEG = -(1 << 62)
# Nodes with more neighbours only ever seed a block: checking them as members costs too much.
HUB_DEGREE = 48
# Penalties double on every memory rejection; unbounded, thousands of rejections reach inf and
# inf * 0 usage is nan, which no comparison in the DP picks. This bound keeps every total finite
# (usages are below 2**63) while still outweighing any cost.
PENALTY_LIMIT = 1e250
# Entries of a block's DP tables (strategies of its nodes): a block that would need more stops growing.
TABLE_ENTRIES = 1 << 16
# A block move tries again with larger penalties this many times in all when its result overloads a row.
MEMORY_ATTEMPTS = 4


class MemoryState(NamedTuple):
    """What tree moves know of memory. `checked` False: rows ignored (moves on penalised costs)."""
    mx: np.ndarray     # int64[2P]: max segment tree over the rows' slack (see `seg_tree`)
    lz: np.ndarray     # int64[2P]: its pending adds
    pen: np.ndarray    # float64[n]: each node's penalty on usage, doubled on every rejection it causes
    pen_unit: float    # the penalty added to every node on a retry
    checked: bool


def ignore_memory(n: int) -> MemoryState:
    """No rows, no penalties: tree moves on the costs alone."""
    mx, lz = seg_tree(np.zeros(1, dtype=np.int64))
    return MemoryState(mx, lz, np.zeros(n), 0.0, False)


class _Block(NamedTuple):
    """Working arrays of one move's block: its nodes in breadth-first order and their DP tables."""
    mark: np.ndarray      # int64[n]: the move that last took each node into the block (-1: none)
    node: np.ndarray      # int64[kmax]
    parent: np.ndarray    # int64[kmax]: block position of the parent, -1 for the seed
    pedge: np.ndarray     # int64[kmax]: the edge to the parent
    toff: np.ndarray      # int64[kmax+1]: node i's strategies at toff[i] in `unary` and `acc`
    argoff: np.ndarray    # int64[kmax+1]: node i's argmin table (over its parent's strategies) at argoff[i]
    unary: np.ndarray     # float64[TABLE_ENTRIES]
    acc: np.ndarray       # float64[TABLE_ENTRIES]: unary plus the folded subtrees
    arg: np.ndarray       # int64[TABLE_ENTRIES]: node i's best strategy given its parent's
    newx: np.ndarray      # int64[kmax]: the DP's choice
    boost: np.ndarray     # float64[kmax]: penalty factor of each node, raised when it overloads a row


@njit(cache=True, nogil=True)
def seg_add(mx, lz, a, b, val):
    """Add val to rows [a, b). Tree of 2P entries, leaves at P..2P-1; mx[i] is the max of i's
    subtree counting the pending adds of i and below (not of i's ancestors)."""
    half = mx.shape[0] // 2
    lo = a + half
    hi = b + half
    while lo < hi:
        if lo & 1:
            mx[lo] += val
            lz[lo] += val
            lo += 1
        if hi & 1:
            hi -= 1
            mx[hi] += val
            lz[hi] += val
        lo >>= 1
        hi >>= 1
    for leaf in (a + half, b - 1 + half):
        i = leaf >> 1
        while i >= 1:
            mx[i] = max(mx[2 * i], mx[2 * i + 1]) + lz[i]
            i >>= 1


@njit(cache=True, nogil=True)
def seg_max(mx, lz, a, b):
    """Max over rows [a, b)."""
    half = mx.shape[0] // 2
    lo = a + half
    hi = b + half
    best = NEG
    while lo < hi:
        if lo & 1:
            best = max(best, mx[lo] + _above(lz, lo))
            lo += 1
        if hi & 1:
            hi -= 1
            best = max(best, mx[hi] + _above(lz, hi))
        lo >>= 1
        hi >>= 1
    return best


@njit(cache=True, nogil=True)
def _above(lz, i):
    total = 0
    i >>= 1
    while i >= 1:
        total += lz[i]
        i >>= 1
    return total


def seg_tree(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mx, lz) of a max segment tree over `values` (int64)."""
    half = 1
    while half < max(len(values), 1):
        half *= 2
    mx = np.full(2 * half, NEG, dtype=np.int64)
    mx[half:half + len(values)] = values
    for i in range(half - 1, 0, -1):
        mx[i] = max(mx[2 * i], mx[2 * i + 1])
    return mx, np.zeros(2 * half, dtype=np.int64)


@njit(cache=True, nogil=True)
def row_slack(f: FlatArrays, x: np.ndarray) -> np.ndarray:
    """load - cap for every row under solution x."""
    num_rows = f.cap.shape[0]
    delta = np.zeros(num_rows + 1, dtype=np.int64)
    for v in range(x.shape[0]):
        u = f.use[f.soff[v] + x[v]]
        if u != 0 and f.r0[v] < f.r1[v]:
            delta[f.r0[v]] += u
            delta[f.r1[v]] -= u
    slack = np.empty(num_rows, dtype=np.int64)
    run = 0
    for r in range(num_rows):
        run += delta[r]
        slack[r] = run - f.cap[r]
    return slack


@njit(cache=True, nogil=True, inline="always")
def edge_cost(f: FlatArrays, e: int, su: int, sv: int) -> float:
    """Cost of edge e with strategy su at its row node and sv at its column node."""
    cols = f.soff[f.ev[e] + 1] - f.soff[f.ev[e]]
    return f.mat[f.moff[e] + su * cols + sv]


@njit(cache=True, nogil=True)
def objective(f: FlatArrays, x: np.ndarray) -> float:
    total = 0.0
    for v in range(x.shape[0]):
        total += f.cost[f.soff[v] + x[v]]
    for e in range(f.eu.shape[0]):
        total += edge_cost(f, e, x[f.eu[e]], x[f.ev[e]])
    return total


def _new_block(n: int, kmax: int) -> _Block:
    return _Block(np.full(n, -1, dtype=np.int64), np.empty(kmax, dtype=np.int64), np.empty(kmax, dtype=np.int64),
                  np.empty(kmax, dtype=np.int64), np.empty(kmax + 1, dtype=np.int64),
                  np.empty(kmax + 1, dtype=np.int64), np.empty(TABLE_ENTRIES, dtype=np.float64),
                  np.empty(TABLE_ENTRIES, dtype=np.float64), np.empty(TABLE_ENTRIES, dtype=np.int64),
                  np.empty(kmax, dtype=np.int64), np.empty(kmax, dtype=np.float64))


@njit(cache=True, nogil=True, inline="always")
def _grow_block(f: FlatArrays, movable: np.ndarray, blk: _Block, seed_node: int, target: int, move: int) -> int:
    """Grow an induced tree of up to `target` nodes breadth first from the seed; returns its size."""
    soff, aoff, anbr, aedge = f.soff, f.aoff, f.anbr, f.aedge
    mark, node, parent, pedge, toff, argoff = blk.mark, blk.node, blk.parent, blk.pedge, blk.toff, blk.argoff
    size = 1
    node[0] = seed_node
    parent[0] = -1
    pedge[0] = -1
    mark[seed_node] = move
    toff[0] = 0
    toff[1] = soff[seed_node + 1] - soff[seed_node]
    argoff[0] = 0
    argoff[1] = 0
    head = 0
    while head < size and size < target:
        v = node[head]
        deg = aoff[v + 1] - aoff[v]
        start = np.random.randint(deg) if deg > 0 else 0
        for k in range(deg):
            if size >= target:
                break
            j = aoff[v] + (start + k) % deg
            w = anbr[j]
            if mark[w] == move or not movable[w] or aoff[w + 1] - aoff[w] > HUB_DEGREE:
                continue
            links = 0  # w's edges into the block: exactly one keeps it a tree
            for jj in range(aoff[w], aoff[w + 1]):
                if mark[anbr[jj]] == move:
                    links += 1
                    if links > 1:
                        break
            if links != 1:
                continue
            sw = soff[w + 1] - soff[w]
            sv = soff[v + 1] - soff[v]
            if toff[size] + sw > TABLE_ENTRIES or argoff[size] + sv > TABLE_ENTRIES:
                continue
            node[size] = w
            parent[size] = head
            pedge[size] = aedge[j]
            mark[w] = move
            toff[size + 1] = toff[size] + sw
            argoff[size + 1] = argoff[size] + sv
            size += 1
        head += 1
    return size


@njit(cache=True, nogil=True, inline="always")
def _unary_terms(f: FlatArrays, pen: np.ndarray, extra: float, x: np.ndarray, blk: _Block, size: int,
                 move: int) -> None:
    """Each block node's own cost, memory penalty (pen + extra, boosted) and edges to the fixed
    nodes outside the block, into `unary` and `acc`."""
    soff, cost, use, ev, moff, mat = f.soff, f.cost, f.use, f.ev, f.moff, f.mat
    aoff, anbr, aedge, arow = f.aoff, f.anbr, f.aedge, f.arow
    mark, node, toff, unary, acc, boost = blk.mark, blk.node, blk.toff, blk.unary, blk.acc, blk.boost
    for i in range(size):
        v = node[i]
        base = soff[v]
        sv = soff[v + 1] - base
        o = toff[i]
        p = (pen[v] + extra) * boost[i]
        for s in range(sv):
            unary[o + s] = cost[base + s] + p * use[base + s]
        for j in range(aoff[v], aoff[v + 1]):
            w = anbr[j]
            if mark[w] == move:
                continue
            e = aedge[j]
            cols = soff[ev[e] + 1] - soff[ev[e]]
            if arow[j] == 1:
                for s in range(sv):
                    unary[o + s] += mat[moff[e] + s * cols + x[w]]
            else:
                for s in range(sv):
                    unary[o + s] += mat[moff[e] + x[w] * cols + s]
        for s in range(sv):
            acc[o + s] = unary[o + s]


@njit(cache=True, nogil=True, inline="always")
def _solve_tree(f: FlatArrays, x: np.ndarray, blk: _Block, size: int) -> None:
    """The block's best choice given the unary terms, into `newx`: fold each node's table into
    its parent's from the leaves, then read the choices off from the root."""
    soff, eu, ev, moff, mat = f.soff, f.eu, f.ev, f.moff, f.mat
    node, parent, pedge, toff, argoff = blk.node, blk.parent, blk.pedge, blk.toff, blk.argoff
    acc, arg, newx = blk.acc, blk.arg, blk.newx
    for i in range(size - 1, 0, -1):
        v = node[i]
        pi = parent[i]
        pv = node[pi]
        e = pedge[i]
        sv = soff[v + 1] - soff[v]
        sp = soff[pv + 1] - soff[pv]
        cols = soff[ev[e] + 1] - soff[ev[e]]
        v_is_row = eu[e] == v
        o = toff[i]
        for t in range(sp):
            best = np.inf
            best_s = 0
            for s in range(sv):
                if v_is_row:
                    c = acc[o + s] + mat[moff[e] + s * cols + t]
                else:
                    c = acc[o + s] + mat[moff[e] + t * cols + s]
                if c < best:
                    best = c
                    best_s = s
            acc[toff[pi] + t] += best
            arg[argoff[i] + t] = best_s
    sv = soff[node[0] + 1] - soff[node[0]]
    best = np.inf
    newx[0] = x[node[0]]  # a defined choice even if no total compares below inf
    for s in range(sv):
        if acc[s] < best:
            best = acc[s]
            newx[0] = s
    for i in range(1, size):
        newx[i] = arg[argoff[i] + newx[parent[i]]]


@njit(cache=True, nogil=True, inline="always")
def _cost_change(f: FlatArrays, x: np.ndarray, blk: _Block, size: int, move: int) -> tuple[float, int]:
    """True change of cost from x to the block's new choice (nodes, edges to outside, tree edges),
    and how many nodes change."""
    soff, cost, eu, ev, moff, mat = f.soff, f.cost, f.eu, f.ev, f.moff, f.mat
    aoff, anbr, aedge, arow = f.aoff, f.anbr, f.aedge, f.arow
    mark, node, parent, pedge, newx = blk.mark, blk.node, blk.parent, blk.pedge, blk.newx
    delta = 0.0
    changed = 0
    for i in range(size):
        v = node[i]
        a = newx[i]
        if a == x[v]:
            continue
        changed += 1
        delta += cost[soff[v] + a] - cost[soff[v] + x[v]]
        for j in range(aoff[v], aoff[v + 1]):
            w = anbr[j]
            if mark[w] == move:
                continue
            e = aedge[j]
            cols = soff[ev[e] + 1] - soff[ev[e]]
            if arow[j] == 1:
                delta += mat[moff[e] + a * cols + x[w]] - mat[moff[e] + x[v] * cols + x[w]]
            else:
                delta += mat[moff[e] + x[w] * cols + a] - mat[moff[e] + x[w] * cols + x[v]]
    for i in range(1, size):
        v = node[i]
        pv = node[parent[i]]
        a = newx[i]
        b = newx[parent[i]]
        if a == x[v] and b == x[pv]:
            continue
        e = pedge[i]
        cols = soff[ev[e] + 1] - soff[ev[e]]
        if eu[e] == v:
            delta += mat[moff[e] + a * cols + b] - mat[moff[e] + x[v] * cols + x[pv]]
        else:
            delta += mat[moff[e] + b * cols + a] - mat[moff[e] + x[pv] * cols + x[v]]
    return delta, changed


@njit(cache=True, nogil=True, inline="always")
def _shift_rows(f: FlatArrays, memory: MemoryState, x: np.ndarray, blk: _Block, size: int, sign: int) -> None:
    """Add (sign 1) or take back (sign -1) the usage changes of the block's new choice in the rows."""
    soff, use, r0, r1, node, newx = f.soff, f.use, f.r0, f.r1, blk.node, blk.newx
    for i in range(size):
        v = node[i]
        if newx[i] != x[v] and r0[v] < r1[v]:
            d = use[soff[v] + newx[i]] - use[soff[v] + x[v]]
            if d != 0:
                seg_add(memory.mx, memory.lz, r0[v], r1[v], sign * d)


@njit(cache=True, nogil=True, inline="always")
def _rows_take(f: FlatArrays, memory: MemoryState, x: np.ndarray, blk: _Block, size: int) -> bool:
    """Apply the new choice's usages to the rows if no row overloads; else raise the penalties of
    the changed nodes on overloaded rows, leave the rows as they were and return False."""
    r0, r1, node, newx, boost, pen = f.r0, f.r1, blk.node, blk.newx, blk.boost, memory.pen
    _shift_rows(f, memory, x, blk, size, 1)
    over = False
    for i in range(size):
        v = node[i]
        if newx[i] != x[v] and r0[v] < r1[v]:
            if seg_max(memory.mx, memory.lz, r0[v], r1[v]) > 0:
                over = True
                boost[i] *= 8.0
                pen[v] = min(max(pen[v] * 2.0, memory.pen_unit * 0.01), PENALTY_LIMIT)
    if over:
        _shift_rows(f, memory, x, blk, size, -1)
    return not over


@njit(cache=True, nogil=True, inline="always")
def _move_block(f: FlatArrays, memory: MemoryState, x: np.ndarray, blk: _Block, size: int, move: int,
                temperature: float) -> tuple[bool, float, int]:
    """Re-optimise the block, retrying with larger penalties while the answer overloads a row;
    returns (moved, cost change, memory rejections). A worse answer passes only by the
    Metropolis test at `temperature`."""
    boost = blk.boost
    for i in range(size):
        boost[i] = 1.0
    rejected = 0
    for attempt in range(MEMORY_ATTEMPTS):
        _unary_terms(f, memory.pen, 0.0 if attempt == 0 else memory.pen_unit, x, blk, size, move)
        _solve_tree(f, x, blk, size)
        delta, changed = _cost_change(f, x, blk, size, move)
        if changed == 0:
            break
        if delta > 0.0:
            if temperature <= 0.0 or np.random.random() >= np.exp(-delta / temperature):
                break
        if memory.checked and not _rows_take(f, memory, x, blk, size):
            rejected += 1
            continue
        for i in range(size):
            x[blk.node[i]] = blk.newx[i]
        return True, delta, rejected
    return False, 0.0, rejected


def block_moves(f: FlatArrays, memory: MemoryState, x: np.ndarray, best_x: np.ndarray, best_obj: float, *,
                num_moves: int, kmax: int, temperature: float, movable: np.ndarray, seed: int,
                centres: np.ndarray | None = None) -> tuple[float, float, int, int, int]:
    """Run `num_moves` tree-block moves of up to `kmax` nodes (blocks of `movable` nodes grown
    from a seed drawn among `centres`, by default every movable node) on x in place; keep the
    best solution seen, if better than `best_obj`, in best_x. A worse block choice is taken only
    by the Metropolis test at `temperature` (0: never).

    x must fit in memory on entry (when `memory.checked`); every accepted move keeps it so.
    Returns (objective of x, best objective, accepted moves, improving moves, memory rejections).
    """
    seeds = np.flatnonzero(movable) if centres is None else np.asarray(centres, dtype=np.int64)[movable[centres]]
    return _block_moves(f, memory, _new_block(len(x), kmax), x, best_x, float(best_obj), num_moves, kmax,
                        float(temperature), movable, seeds, seed)


# Compiled without reference counting (numba's private `_nrt` option; the function allocates
# nothing, the caller passes the workspace): with it, every look-up of a record's array in the
# inlined helpers counts a reference, an atomic operation per array per helper per move, and the
# moves run slower than one monolithic function's. The helpers are inlined for the same reason: a
# call passes both records by value.
@njit(cache=True, nogil=True, _nrt=False)
def _block_moves(f: FlatArrays, memory: MemoryState, blk: _Block, x: np.ndarray, best_x: np.ndarray, best_obj: float,
                 num_moves: int, kmax: int, temperature: float, movable: np.ndarray, movable_nodes: np.ndarray,
                 seed: int) -> tuple[float, float, int, int, int]:
    np.random.seed(seed)
    obj = objective(f, x)
    if obj < best_obj:
        best_obj = obj
        for v in range(x.shape[0]):
            best_x[v] = x[v]
    if movable_nodes.shape[0] == 0:
        return obj, best_obj, 0, 0, 0
    accepted = 0
    improved = 0
    rejected_memory = 0
    for move in range(num_moves):
        seed_node = movable_nodes[np.random.randint(movable_nodes.shape[0])]
        target = 1 + np.random.randint(kmax)
        size = _grow_block(f, movable, blk, seed_node, target, move)
        moved, delta, rejected = _move_block(f, memory, x, blk, size, move, temperature)
        rejected_memory += rejected
        if moved:
            obj += delta
            accepted += 1
            if delta < 0.0:
                improved += 1
            if obj < best_obj:
                best_obj = obj
                for v in range(x.shape[0]):
                    best_x[v] = x[v]
    return obj, best_obj, accepted, improved, rejected_memory
