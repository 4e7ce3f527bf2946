"""Partition crossover: the cheapest mix of two solutions, taken region by region.

Where a solution `x` differs from a `base` solution, its differing nodes fall into regions: sets
joined by edges whose two ends both differ. No edge joins two regions, so what a region changes
— its nodes' costs and the costs of the edges that touch it — does not depend on which other
regions are taken. The cheapest mix therefore takes every region that lowers the cost and
chooses no forbidden pair; memory is the only coupling, so the regions are taken best first,
each only while every row it touches still fits.

This makes a relaxation's decode useful even when it breaks a few forbidden pairs or overloads
some rows (on instances where over half of all edge entries are forbidden, almost every decode
does): its good regions move into the best solution at the price of one pass over the edges.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from autoshard.solver.flat import FORBIDDEN, FlatArrays, FlatProblem
from autoshard.solver.kernels import edge_cost, row_slack, seg_add, seg_max, seg_tree


# Reverting a forbidden pair can make the next pair of a chain forbidden: passes until none is
# left, at most this many (a region still holding one is then left out whole).
REPAIR_ROUNDS = 32


@njit(cache=True, nogil=True)
def _root(parent: np.ndarray, v: int) -> int:
    while parent[v] != v:
        parent[v] = parent[parent[v]]
        v = parent[v]
    return v


@njit(cache=True, nogil=True)
def _regions(f: FlatArrays, base: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, int]:
    """Each node's region (-1 where x agrees with base) and the number of regions."""
    n = base.shape[0]
    parent = np.arange(n)
    for e in range(f.eu.shape[0]):
        u, v = f.eu[e], f.ev[e]
        if base[u] != x[u] and base[v] != x[v]:
            ru, rv = _root(parent, u), _root(parent, v)
            if ru != rv:
                parent[max(ru, rv)] = min(ru, rv)
    region = np.full(n, -1, dtype=np.int64)
    label = np.full(n, -1, dtype=np.int64)
    count = 0
    for v in range(n):
        if base[v] != x[v]:
            r = _root(parent, v)
            if label[r] < 0:
                label[r] = count
                count += 1
            region[v] = label[r]
    return region, count


@njit(cache=True, nogil=True)
def _region_changes(f: FlatArrays, base: np.ndarray, x: np.ndarray, region: np.ndarray, count: int
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Per region, the cost change of taking x's choices there, and whether that picks a forbidden pair."""
    delta = np.zeros(count)
    forbidden = np.zeros(count, dtype=np.bool_)
    for v in range(base.shape[0]):
        if region[v] >= 0:
            new = f.cost[f.soff[v] + x[v]]
            if new >= FORBIDDEN:
                forbidden[region[v]] = True
            delta[region[v]] += new - f.cost[f.soff[v] + base[v]]
    for e in range(f.eu.shape[0]):
        u, v = f.eu[e], f.ev[e]
        r = region[u] if region[u] >= 0 else region[v]
        if r < 0:
            continue
        su = x[u] if region[u] >= 0 else base[u]
        sv = x[v] if region[v] >= 0 else base[v]
        new = edge_cost(f, e, su, sv)
        if new >= FORBIDDEN:
            forbidden[r] = True
        delta[r] += new - edge_cost(f, e, base[u], base[v])
    return delta, forbidden


@njit(cache=True, nogil=True)
def _revert_forbidden(f: FlatArrays, base: np.ndarray, x: np.ndarray) -> int:
    """Give every differing node of a forbidden pair (or with a forbidden cost) of the mix of x
    over base its base choice, in place; returns how many nodes were reverted."""
    reverted = 0
    for v in range(x.shape[0]):
        if x[v] != base[v] and f.cost[f.soff[v] + x[v]] >= FORBIDDEN:
            x[v] = base[v]
            reverted += 1
    for e in range(f.eu.shape[0]):
        u, v = f.eu[e], f.ev[e]
        if (x[u] != base[u] or x[v] != base[v]) and edge_cost(f, e, x[u], x[v]) >= FORBIDDEN:
            # Which end is wrong is unknown: both go back, the base pair being allowed.
            reverted += int(x[u] != base[u]) + int(x[v] != base[v])
            x[u] = base[u]
            x[v] = base[v]
    return reverted


@njit(cache=True, nogil=True)
def _take_regions(f: FlatArrays, base: np.ndarray, x: np.ndarray, order: np.ndarray, members: np.ndarray,
                  start: np.ndarray, mx: np.ndarray, lz: np.ndarray) -> np.ndarray:
    """Take the regions in `order` (their nodes are members[start[r]:start[r + 1]]) into a copy of
    base while no row they raise goes over its capacity."""
    y = base.copy()
    for r in order:
        raises = False
        for i in range(start[r], start[r + 1]):
            v = members[i]
            d = f.use[f.soff[v] + x[v]] - f.use[f.soff[v] + base[v]]
            if d != 0 and f.r0[v] < f.r1[v]:
                seg_add(mx, lz, f.r0[v], f.r1[v], d)
                raises = raises or d > 0
        fits = True
        if raises:
            for i in range(start[r], start[r + 1]):
                v = members[i]
                if f.r0[v] < f.r1[v] and f.use[f.soff[v] + x[v]] > f.use[f.soff[v] + base[v]]:
                    if seg_max(mx, lz, f.r0[v], f.r1[v]) > 0:
                        fits = False
                        break
        if fits:
            for i in range(start[r], start[r + 1]):
                y[members[i]] = x[members[i]]
        else:
            for i in range(start[r], start[r + 1]):
                v = members[i]
                d = f.use[f.soff[v] + x[v]] - f.use[f.soff[v] + base[v]]
                if d != 0 and f.r0[v] < f.r1[v]:
                    seg_add(mx, lz, f.r0[v], f.r1[v], -d)
    return y


def cross(fp: FlatProblem, base: np.ndarray, x: np.ndarray) -> np.ndarray:
    """`base` with every region of `x` that lowers the cost, picks no forbidden pair and keeps the
    rows it raises within capacity, the most improving first, after x's nodes on forbidden pairs
    went back to their base choice. A row `base` already overloads stays as loaded as before or
    less; a forbidden pair of `base` is left only where x does not remove it."""
    f = fp.arrays
    x = x.copy()
    for _ in range(REPAIR_ROUNDS):
        if _revert_forbidden(f, base, x) == 0:
            break
    region, count = _regions(f, base, x)
    if count == 0:
        return base.copy()
    delta, forbidden = _region_changes(f, base, x, region, count)
    wanted = np.flatnonzero((delta < 0) & ~forbidden)
    order = wanted[np.argsort(delta[wanted], kind="stable")]
    members = np.argsort(region, kind="stable")[int((region < 0).sum()):]
    start = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(np.bincount(region[region >= 0], minlength=count), out=start[1:])
    mx, lz = seg_tree(row_slack(f, base))
    return _take_regions(f, base, x, order, members, start, mx, lz)
