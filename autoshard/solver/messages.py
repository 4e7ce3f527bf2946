"""Sequential tree-reweighted message passing (TRW-S) on the pairwise problem without memory.

The messages reparametrise the costs: with `msg[j]` the message into node v along its
adjacency entry j (edge e),

    node'(v, s)    = cost(v, s) + pen(v) * use(v, s) + sum_j msg[j](s)
    edge'(e, s, t) = E_e(s, t) - msg[j_u](s) - msg[j_v](t)

which leaves the cost of every assignment unchanged, so

    sum_v min_s node'(v, s) + sum_e min_{s,t} edge'(e, s, t)

is a lower bound on the optimum of the problem without memory limit, whatever the messages
(in exact arithmetic; `bound` subtracts a margin for float rounding). Passes alternate
forward and backward over the node order; each forward pass also decodes an assignment,
choosing every node given its already decided neighbours and the messages from the others.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def message_offsets(soff, aoff, anbr):
    """Offsets of the message into v along each adjacency entry j (|S_v| values each)."""
    n = soff.shape[0] - 1
    off = np.empty(anbr.shape[0] + 1, dtype=np.int64)
    off[0] = 0
    for v in range(n):
        for j in range(aoff[v], aoff[v + 1]):
            off[j + 1] = off[j] + soff[v + 1] - soff[v]
    return off


@njit(cache=True, nogil=True)
def _partner(aoff, anbr, aedge, w, e):
    for j in range(aoff[w], aoff[w + 1]):
        if aedge[j] == e:
            return j
    return -1


@njit(cache=True, nogil=True)
def partners(aoff, anbr, aedge):
    """For each adjacency entry (v, e), the entry (w, e) at the edge's other end."""
    out = np.empty(anbr.shape[0], dtype=np.int64)
    for v in range(aoff.shape[0] - 1):
        for j in range(aoff[v], aoff[v + 1]):
            out[j] = _partner(aoff, anbr, aedge, anbr[j], aedge[j])
    return out


@njit(cache=True, nogil=True)
def trws_passes(num_passes, order, soff, cost, use, pen, eu, ev, mstart, mat, aoff, anbr, aedge, arow,
                part, msg_off, msg, x_out):
    """Run forward+backward passes; the last forward pass's decoded assignment goes to x_out."""
    n = soff.shape[0] - 1
    rank = np.empty(n, dtype=np.int64)
    for i in range(n):
        rank[order[i]] = i
    max_s = 0
    for v in range(n):
        max_s = max(max_s, soff[v + 1] - soff[v])
    belief = np.empty(max_s, dtype=np.float64)
    decide = np.empty(max_s, dtype=np.float64)
    head = np.empty(max_s, dtype=np.float64)
    for p in range(2 * num_passes):
        forward = p % 2 == 0
        for i in range(n):
            v = order[i] if forward else order[n - 1 - i]
            base = soff[v]
            sv = soff[v + 1] - base
            for s in range(sv):
                belief[s] = cost[base + s] + pen[v] * use[base + s]
            n_before = 0
            n_after = 0
            for j in range(aoff[v], aoff[v + 1]):
                if rank[anbr[j]] < rank[v]:
                    n_before += 1
                else:
                    n_after += 1
                o = msg_off[j]
                for s in range(sv):
                    belief[s] += msg[o + s]
            if forward:
                # Decode: decided neighbours by their edge row, the others by their message.
                for s in range(sv):
                    decide[s] = cost[base + s] + pen[v] * use[base + s]
                for j in range(aoff[v], aoff[v + 1]):
                    w = anbr[j]
                    if rank[w] < rank[v]:
                        e = aedge[j]
                        cols = soff[ev[e] + 1] - soff[ev[e]]
                        for s in range(sv):
                            if arow[j] == 1:
                                decide[s] += mat[mstart[e] + s * cols + x_out[w]]
                            else:
                                decide[s] += mat[mstart[e] + x_out[w] * cols + s]
                    else:
                        o = msg_off[j]
                        for s in range(sv):
                            decide[s] += msg[o + s]
                best = np.inf
                for s in range(sv):
                    if decide[s] < best:
                        best = decide[s]
                        x_out[v] = s
            gamma = 1.0 / max(1, max(n_before, n_after))
            for j in range(aoff[v], aoff[v + 1]):
                w = anbr[j]
                if (rank[w] > rank[v]) != forward:
                    continue
                ov = msg_off[j]
                for s in range(sv):
                    head[s] = gamma * belief[s] - msg[ov + s]
                _min_over_edge(head, sv, mat, mstart[aedge[j]], soff[w + 1] - soff[w], arow[j] == 1, msg,
                               msg_off[part[j]])


@njit(cache=True, nogil=True)
def _min_over_edge(head, sv, mat, base, sw, v_is_row, msg, ow):
    """msg[ow + t] = min_s head[s] + E(s, t), less its minimum over t: the message into w along an
    edge whose matrix starts at mat[base] (v's strategies s index its rows when `v_is_row`, its
    columns otherwise). Both loop orders walk the matrix row by row, the innermost loop over
    contiguous entries: the message passes spend their time here."""
    if v_is_row:
        for t in range(sw):
            msg[ow + t] = np.inf
        for s in range(sv):
            h = head[s]
            row = base + s * sw
            for t in range(sw):
                msg[ow + t] = min(msg[ow + t], h + mat[row + t])
    else:
        for t in range(sw):
            row = base + t * sv
            best = np.inf
            for s in range(sv):
                best = min(best, head[s] + mat[row + s])
            msg[ow + t] = best
    low = np.inf
    for t in range(sw):
        low = min(low, msg[ow + t])
    for t in range(sw):
        msg[ow + t] -= low


@njit(cache=True, nogil=True)
def _node_reparam(v, soff, cost, use, pen, aoff, msg_off, msg, out):
    base = soff[v]
    for s in range(soff[v + 1] - base):
        c = cost[base + s] + pen[v] * use[base + s]
        for j in range(aoff[v], aoff[v + 1]):
            c += msg[msg_off[j] + s]
        out[s] = c


@njit(cache=True, nogil=True)
def bound(soff, cost, use, pen, eu, ev, mstart, mat, aoff, anbr, aedge, arow, part, msg_off, msg):
    """The lower bound of the reparametrisation, each node's term shared evenly among its edges
    (see the module docstring), minus a margin for float rounding."""
    n = soff.shape[0] - 1
    max_s = 0
    for v in range(n):
        max_s = max(max_s, soff[v + 1] - soff[v])
    node_u = np.empty(max_s, dtype=np.float64)
    node_w = np.empty(max_s, dtype=np.float64)
    total = 0.0
    magnitude = 0.0
    for v in range(n):
        if aoff[v + 1] > aoff[v]:
            continue
        _node_reparam(v, soff, cost, use, pen, aoff, msg_off, msg, node_u)
        best = np.inf
        for s in range(soff[v + 1] - soff[v]):
            best = min(best, node_u[s])
        total += best
        magnitude += abs(best)
    for v in range(n):
        su = soff[v + 1] - soff[v]
        du = 1.0 / (aoff[v + 1] - aoff[v]) if aoff[v + 1] > aoff[v] else 0.0
        _node_reparam(v, soff, cost, use, pen, aoff, msg_off, msg, node_u)
        for j in range(aoff[v], aoff[v + 1]):
            if arow[j] != 1:
                continue
            e = aedge[j]
            w = anbr[j]
            jw = part[j]
            sw = soff[w + 1] - soff[w]
            dw = 1.0 / (aoff[w + 1] - aoff[w])
            _node_reparam(w, soff, cost, use, pen, aoff, msg_off, msg, node_w)
            best = np.inf
            for s in range(su):
                ms = du * node_u[s] - msg[msg_off[j] + s]
                for t in range(sw):
                    c = mat[mstart[e] + s * sw + t] + ms + dw * node_w[t] - msg[msg_off[jw] + t]
                    if c < best:
                        best = c
            total += best
            magnitude += abs(best)
    # Each term carries a relative rounding error of a few ulps; be conservative.
    return total - 1e-12 * magnitude * 64.0
