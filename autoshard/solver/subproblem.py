"""A neighbourhood of a solution as a problem of its own (for large neighbourhood search).

The nodes of `nodes` keep their strategies; every other node is fixed at its current choice.
Edges to fixed nodes become node costs; memory rows keep only the capacity the fixed nodes
leave. Solving the result and writing its answer back into the full solution never worsens
the cost as long as the current choices are hinted (they are feasible for the subproblem).
"""

from __future__ import annotations

import numpy as np

from autoshard.solver.flat import FlatProblem, merge_rows, row_load
from autoshard.solver.kernels import row_slack


def restrict(fp: FlatProblem, nodes: np.ndarray, x: np.ndarray) -> FlatProblem:
    """The subproblem over `nodes` (sorted, unique) with every other node fixed as in x."""
    nodes = np.asarray(nodes, dtype=np.int64)
    local = np.full(fp.n, -1, dtype=np.int64)
    local[nodes] = np.arange(len(nodes))
    sizes = fp.sizes()[nodes]
    soff = np.zeros(len(nodes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=soff[1:])
    cost = np.concatenate([fp.cost[fp.soff[v]:fp.soff[v + 1]] for v in nodes])
    use = np.concatenate([fp.use[fp.soff[v]:fp.soff[v + 1]] for v in nodes])
    inside_u = local[fp.eu] >= 0
    inside_v = local[fp.ev] >= 0
    all_sizes = fp.sizes()
    for e in np.flatnonzero(inside_u ^ inside_v):
        u, v = int(fp.eu[e]), int(fp.ev[e])
        matrix = fp.mat[fp.moff[e]:fp.moff[e + 1]].reshape(all_sizes[u], all_sizes[v])
        if inside_u[e]:
            k = local[u]
            cost[soff[k]:soff[k + 1]] += matrix[:, x[v]]
        else:
            k = local[v]
            cost[soff[k]:soff[k + 1]] += matrix[x[u], :]
    both = np.flatnonzero(inside_u & inside_v)
    eu, ev = local[fp.eu[both]], local[fp.ev[both]]
    blocks = [fp.mat[fp.moff[e]:fp.moff[e + 1]] for e in both]
    moff = np.zeros(len(both) + 1, dtype=np.int64)
    np.cumsum([len(b) for b in blocks], out=moff[1:])
    mat = np.concatenate(blocks) if blocks else np.zeros(0)
    ends = np.concatenate([eu, ev])
    order = np.argsort(ends, kind="stable")
    aoff = np.zeros(len(nodes) + 1, dtype=np.int64)
    np.cumsum(np.bincount(ends, minlength=len(nodes)), out=aoff[1:])
    ids = np.concatenate([np.arange(len(both)), np.arange(len(both))])
    # Memory: every row with the load of everything else taken off; rows no free node touches
    # stay only when the fixed nodes alone overload them (then nothing fits, as in the whole).
    r0, r1 = fp.r0[nodes], fp.r1[nodes]
    spans = r1 > r0
    if fp.num_rows:
        x_free_zero = x.copy()
        x_free_zero[nodes] = 0
        slack = row_slack(fp.arrays, x_free_zero)
        # Strategy 0 of a free node may use memory: take it off again.
        cap = -(slack - row_load(r0, r1, fp.use[fp.soff[nodes]], fp.num_rows))
        r0, r1, cap, steps = merge_rows(np.where(spans, r0, 0), np.where(spans, r1, 0), cap, fp.row_steps)
    else:
        cap = np.zeros(0, dtype=np.int64)
        r0 = np.zeros(len(nodes), dtype=np.int64)
        r1 = np.zeros(len(nodes), dtype=np.int64)
        steps = np.zeros(0, dtype=np.int64)
    return FlatProblem(n=len(nodes), soff=soff, orig=np.concatenate([np.arange(s) for s in sizes]),
                       cost=cost, use=use, eu=eu, ev=ev, moff=moff, mat=mat, aoff=aoff,
                       anbr=np.concatenate([ev, eu])[order], aedge=ids[order],
                       arow=np.concatenate([np.ones(len(both), np.int8), np.zeros(len(both), np.int8)])[order],
                       r0=r0, r1=r1, cap=cap.astype(np.int64), row_steps=steps)
