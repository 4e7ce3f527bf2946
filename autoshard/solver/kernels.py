"""Compiled inner loops of the local search (numba; the arrays are those of FlatProblem).

Memory rows live in a segment tree over `slack[r] = load[r] - cap[r]` with range add and range
max, so a move's memory check costs O(log R). The main move re-optimises a random *induced
tree* of nodes exactly by dynamic programming, all other nodes fixed: the block grows from a
seed node, adding a neighbour only if it has exactly one edge into the block, so the block's
internal edges form a tree and the DP is exact for the block's cost. Memory enters the DP as a
per-node penalty on usage; a result that overloads a row is retried with larger penalties on
the offending nodes and, failing that, rejected.
"""

from __future__ import annotations

import numpy as np
from numba import njit

NEG = -(1 << 62)
# Nodes with more neighbours only ever seed a block: checking them as members costs too much.
HUB_DEGREE = 48
# Penalties double on every memory rejection; unbounded, thousands of rejections reach inf and
# inf * 0 usage is nan, which no comparison in the DP picks. This bound keeps every total finite
# (usages are below 2**63) while still outweighing any cost.
PENALTY_LIMIT = 1e250


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
def row_slack(soff, use, r0, r1, cap, x):
    """load - cap for every row under solution x."""
    num_rows = cap.shape[0]
    delta = np.zeros(num_rows + 1, dtype=np.int64)
    for v in range(x.shape[0]):
        u = use[soff[v] + x[v]]
        if u != 0 and r0[v] < r1[v]:
            delta[r0[v]] += u
            delta[r1[v]] -= u
    slack = np.empty(num_rows, dtype=np.int64)
    run = 0
    for r in range(num_rows):
        run += delta[r]
        slack[r] = run - cap[r]
    return slack


@njit(cache=True, nogil=True)
def edge_cost(soff, moff, mat, eu, ev, e, su, sv):
    cols = soff[ev[e] + 1] - soff[ev[e]]
    return mat[moff[e] + su * cols + sv]


@njit(cache=True, nogil=True)
def objective(soff, cost, eu, ev, moff, mat, x):
    total = 0.0
    for v in range(x.shape[0]):
        total += cost[soff[v] + x[v]]
    for e in range(eu.shape[0]):
        total += edge_cost(soff, moff, mat, eu, ev, e, x[eu[e]], x[ev[e]])
    return total


@njit(cache=True, nogil=True)
def block_moves(num_moves, kmax, temperature, x, best_x, best_obj_in, soff, cost, use, eu, ev, moff, mat,
                aoff, anbr, aedge, arow, r0, r1, mx, lz, num_rows, pen, pen_unit, movable, seed):
    """Run `num_moves` tree-block moves on x (in place); keep the best solution seen in best_x.

    x must fit in memory on entry; every accepted move keeps it so. Returns
    (objective of x, best objective, accepted moves, improving moves, memory rejections).
    """
    np.random.seed(seed)
    n = x.shape[0]
    obj = objective(soff, cost, eu, ev, moff, mat, x)
    best_obj = best_obj_in
    if obj < best_obj:
        best_obj = obj
        best_x[:] = x
    mark = np.full(n, -1, dtype=np.int64)
    block = np.empty(kmax, dtype=np.int64)
    parent = np.empty(kmax, dtype=np.int64)      # block position of the parent, -1 for the seed
    pedge = np.empty(kmax, dtype=np.int64)
    poff = np.empty(kmax + 1, dtype=np.int64)    # node tables: strategies of block[i] at poff[i]
    aoff_tab = np.empty(kmax + 1, dtype=np.int64)  # argmin tables: parent strategies at aoff_tab[i]
    cap_tab = 1 << 16
    unary = np.empty(cap_tab, dtype=np.float64)
    acc = np.empty(cap_tab, dtype=np.float64)
    arg = np.empty(cap_tab, dtype=np.int64)
    newx = np.empty(kmax, dtype=np.int64)
    boost = np.empty(kmax, dtype=np.float64)
    movable_nodes = np.flatnonzero(movable)
    if movable_nodes.shape[0] == 0:
        return obj, best_obj, 0, 0, 0
    accepted = 0
    improved = 0
    rejected_memory = 0
    for move in range(num_moves):
        seed_node = movable_nodes[np.random.randint(movable_nodes.shape[0])]
        target = 1 + np.random.randint(kmax)
        # Grow an induced tree by breadth-first search from the seed.
        size = 1
        block[0] = seed_node
        parent[0] = -1
        pedge[0] = -1
        mark[seed_node] = move  # block membership, stamped by move number
        poff[0] = 0
        poff[1] = soff[seed_node + 1] - soff[seed_node]
        aoff_tab[0] = 0
        aoff_tab[1] = 0
        head = 0
        while head < size and size < target:
            v = block[head]
            deg = aoff[v + 1] - aoff[v]
            start = np.random.randint(deg) if deg > 0 else 0
            for k in range(deg):
                if size >= target:
                    break
                j = aoff[v] + (start + k) % deg
                w = anbr[j]
                if mark[w] == move or not movable[w] or aoff[w + 1] - aoff[w] > HUB_DEGREE:
                    continue
                links = 0
                for jj in range(aoff[w], aoff[w + 1]):
                    if mark[anbr[jj]] == move:
                        links += 1
                        if links > 1:
                            break
                if links != 1:
                    continue
                sw = soff[w + 1] - soff[w]
                sv = soff[v + 1] - soff[v]
                if poff[size] + sw > cap_tab or aoff_tab[size] + sv > cap_tab:
                    continue
                block[size] = w
                parent[size] = head
                pedge[size] = aedge[j]
                mark[w] = move
                poff[size + 1] = poff[size] + sw
                aoff_tab[size + 1] = aoff_tab[size] + sv
                size += 1
            head += 1
        for i in range(size):
            boost[i] = 1.0
        done = False
        for attempt in range(4):
            # Unary terms: own cost, memory penalty, edges to fixed nodes outside the block.
            for i in range(size):
                v = block[i]
                base = soff[v]
                sv = soff[v + 1] - base
                p = (pen[v] + (0.0 if attempt == 0 else pen_unit)) * boost[i]
                for s in range(sv):
                    unary[poff[i] + s] = cost[base + s] + p * use[base + s]
                for j in range(aoff[v], aoff[v + 1]):
                    w = anbr[j]
                    if mark[w] == move:
                        continue
                    e = aedge[j]
                    cols = soff[ev[e] + 1] - soff[ev[e]]
                    if arow[j] == 1:
                        for s in range(sv):
                            unary[poff[i] + s] += mat[moff[e] + s * cols + x[w]]
                    else:
                        for s in range(sv):
                            unary[poff[i] + s] += mat[moff[e] + x[w] * cols + s]
                for s in range(sv):
                    acc[poff[i] + s] = unary[poff[i] + s]
            # Leaves to root: fold each node's table into its parent's.
            for i in range(size - 1, 0, -1):
                v = block[i]
                pi = parent[i]
                pv = block[pi]
                e = pedge[i]
                sv = soff[v + 1] - soff[v]
                sp = soff[pv + 1] - soff[pv]
                cols = soff[ev[e] + 1] - soff[ev[e]]
                v_is_row = eu[e] == v
                for t in range(sp):
                    best = np.inf
                    best_s = 0
                    for s in range(sv):
                        if v_is_row:
                            c = acc[poff[i] + s] + mat[moff[e] + s * cols + t]
                        else:
                            c = acc[poff[i] + s] + mat[moff[e] + t * cols + s]
                        if c < best:
                            best = c
                            best_s = s
                    acc[poff[pi] + t] += best
                    arg[aoff_tab[i] + t] = best_s
            # Root to leaves: read off the choice.
            sv = soff[block[0] + 1] - soff[block[0]]
            best = np.inf
            newx[0] = x[block[0]]  # a defined choice even if no total compares below inf
            for s in range(sv):
                if acc[s] < best:
                    best = acc[s]
                    newx[0] = s
            for i in range(1, size):
                newx[i] = arg[aoff_tab[i] + newx[parent[i]]]
            # True change of cost: nodes, edges to outside, tree edges.
            delta = 0.0
            changed = 0
            for i in range(size):
                v = block[i]
                if newx[i] == x[v]:
                    continue
                changed += 1
                delta += cost[soff[v] + newx[i]] - cost[soff[v] + x[v]]
                for j in range(aoff[v], aoff[v + 1]):
                    w = anbr[j]
                    if mark[w] == move:
                        continue
                    e = aedge[j]
                    if arow[j] == 1:
                        delta += edge_cost(soff, moff, mat, eu, ev, e, newx[i], x[w]) - \
                            edge_cost(soff, moff, mat, eu, ev, e, x[v], x[w])
                    else:
                        delta += edge_cost(soff, moff, mat, eu, ev, e, x[w], newx[i]) - \
                            edge_cost(soff, moff, mat, eu, ev, e, x[w], x[v])
            for i in range(1, size):
                v = block[i]
                pv = block[parent[i]]
                if newx[i] == x[v] and newx[parent[i]] == x[pv]:
                    continue
                e = pedge[i]
                if eu[e] == v:
                    delta += edge_cost(soff, moff, mat, eu, ev, e, newx[i], newx[parent[i]]) - \
                        edge_cost(soff, moff, mat, eu, ev, e, x[v], x[pv])
                else:
                    delta += edge_cost(soff, moff, mat, eu, ev, e, newx[parent[i]], newx[i]) - \
                        edge_cost(soff, moff, mat, eu, ev, e, x[pv], x[v])
            if changed == 0:
                break
            if delta > 0.0:
                if temperature <= 0.0 or np.random.random() >= np.exp(-delta / temperature):
                    break
            # Memory: apply, check every changed node's rows, roll back on overload.
            if num_rows > 0:
                for i in range(size):
                    v = block[i]
                    if newx[i] != x[v] and r0[v] < r1[v]:
                        d = use[soff[v] + newx[i]] - use[soff[v] + x[v]]
                        if d != 0:
                            seg_add(mx, lz, r0[v], r1[v], d)
                over = False
                for i in range(size):
                    v = block[i]
                    if newx[i] != x[v] and r0[v] < r1[v]:
                        if seg_max(mx, lz, r0[v], r1[v]) > 0:
                            over = True
                            boost[i] *= 8.0
                            pen[v] = min(max(pen[v] * 2.0, pen_unit * 0.01), PENALTY_LIMIT)
                if over:
                    for i in range(size):
                        v = block[i]
                        if newx[i] != x[v] and r0[v] < r1[v]:
                            d = use[soff[v] + newx[i]] - use[soff[v] + x[v]]
                            if d != 0:
                                seg_add(mx, lz, r0[v], r1[v], -d)
                    rejected_memory += 1
                    continue
            for i in range(size):
                x[block[i]] = newx[i]
            obj += delta
            accepted += 1
            if delta < 0.0:
                improved += 1
            done = True
            break
        if done and obj < best_obj:
            best_obj = obj
            best_x[:] = x
    return obj, best_obj, accepted, improved, rejected_memory
