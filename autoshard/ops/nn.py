"""Neural-network blocks: scaled-dot-product attention and NHWC conv2d."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from autoshard.affine import AffineExpr, AffineMap
from autoshard.ops.loops import INVALID, PARALLEL, REDUCTION, LoopNest
from autoshard.ops.table import Attrs, Context, OpError, OpKind, Shape, int_list_attr, register, shape_error


# --- scaled-dot-product attention -------------------------------------------------------
def _sdpa_loops(shapes: Sequence[Shape], attrs: Attrs) -> LoopNest:
    """Loops b, h, s (queries), e (value features): parallel; t (keys), d (query features): invalid.

    Splitting t would need the online-softmax rescaling, and splitting d makes the scores
    partial before the softmax, so both stay whole. An optional fourth input is a mask that
    broadcasts (numpy rules) to the scores [B, H, S, T]: a bool mask keeps the scores where it
    is true, any other mask is added to them.
    """
    q, k, v = shapes[:3]
    if len(q) != 4 or len(k) != 4 or len(v) != 4 or q[:2] != k[:2] or k[:3] != v[:3] or q[3] != k[3]:
        raise shape_error("q [B, H, S, D], k [B, H, T, D], v [B, H, T, E]", shapes)
    b, h, s, d = q
    t, e = k[2], v[3]
    L = lambda *loops: AffineMap(6, tuple(AffineExpr.loop(i) for i in loops))  # noqa: E731
    # loop order: b0 h1 s2 e3 t4 d5
    maps = (L(0, 1, 2, 5), L(0, 1, 4, 5), L(0, 1, 4, 3))
    if len(shapes) == 4:
        maps += (_mask_map(shapes[3], (b, h, s, t), shapes),)
    return LoopNest((b, h, s, e, t, d), (PARALLEL, PARALLEL, PARALLEL, PARALLEL, INVALID, INVALID),
                    maps, (L(0, 1, 2, 3),))


def _mask_map(mask: Shape, scores: Shape, shapes: Sequence[Shape]) -> AffineMap:
    """The mask's dims, right-aligned to the scores' loops b, h, s, t; a size-1 dim reads index 0."""
    if len(mask) > 4 or any(m not in (1, n) for m, n in zip(mask, scores[4 - len(mask):])):
        raise shape_error("a mask that broadcasts to the scores [B, H, S, T]", shapes)
    loops = (0, 1, 2, 4)[4 - len(mask):]
    return AffineMap(6, tuple(AffineExpr.constant(0) if m == 1 and n != 1 else AffineExpr.loop(l)
                              for m, n, l in zip(mask, scores[4 - len(mask):], loops)))


def attention_weights(inputs: Sequence[np.ndarray], ctx: Context) -> np.ndarray:
    """softmax(q k^T * scale) over the keys, with the causal mask and the mask input applied;
    `inputs` are q, k, v and the optional mask, each cut to the block."""
    q, k = inputs[0], inputs[1]
    scale = ctx.attrs.get("scale", 1.0 / np.sqrt(ctx.block.extents[5]))
    scores = np.einsum("bhsd,bhtd->bhst", q, k) * scale
    if ctx.attrs.get("causal", False):
        # Positions are global: a device holding queries [s0, s0 + S) masks keys after each query.
        s0 = ctx.block.starts[2]
        rows = s0 + np.arange(q.shape[2])[:, None]
        cols = np.arange(k.shape[2])[None, :]
        scores = np.where(cols <= rows, scores, -np.inf)
    if len(inputs) == 4:
        mask = inputs[3]
        scores = np.where(mask, scores, -np.inf) if mask.dtype == np.bool_ else scores + mask
    scores = scores - np.max(scores, axis=-1, keepdims=True)
    weights = np.exp(scores)
    return weights / np.sum(weights, axis=-1, keepdims=True)


def _sdpa(inputs: list[np.ndarray], ctx: Context) -> list[np.ndarray]:
    return [np.einsum("bhst,bhte->bhse", attention_weights(inputs, ctx), inputs[2])]


def _sdpa_flops(nest: LoopNest, attrs: Attrs) -> float:
    b, h, s, e, t, d = nest.extents
    return 2.0 * b * h * s * t * (d + e) + 5.0 * b * h * s * t


register(OpKind("attention", (3, 4), _sdpa_loops, _sdpa, _sdpa_flops, attrs=("causal", "scale"),
                doc="softmax(q k^T * scale [causal mask] [mask]) v over [B, H, S, D] heads, optional mask input"))


# --- conv2d NHWC -----------------------------------------------------------------------
def _conv_params(attrs: Attrs) -> tuple[tuple[int, int], tuple[tuple[int, int], tuple[int, int]]]:
    strides = int_list_attr(attrs, "strides", (1, 1))
    pad = attrs.get("padding", [[0, 0], [0, 0]])
    if len(strides) != 2 or min(strides) < 1:
        raise OpError(f"attribute 'strides' must be two positive integers, got {list(strides)}", "strides")
    if (not isinstance(pad, (list, tuple)) or len(pad) != 2
            or not all(isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(x, int) and x >= 0 for x in p) for p in pad)):
        raise OpError(f"attribute 'padding' must be [[top, bottom], [left, right]] of non-negative integers, got {pad!r}", "padding")
    return (strides[0], strides[1]), ((pad[0][0], pad[0][1]), (pad[1][0], pad[1][1]))


def _conv_loops(shapes: Sequence[Shape], attrs: Attrs) -> LoopNest:
    x, w = shapes
    if len(x) != 4 or len(w) != 4 or x[3] != w[2]:
        raise shape_error("x [N, H, W, C] and filter [KH, KW, C, F]", shapes)
    (sh, sw), ((pt, pb), (pl, pr)) = _conv_params(attrs)
    n, hh, ww, c = x
    kh, kw, _, f = w
    oh, ow = (hh + pt + pb - kh) // sh + 1, (ww + pl + pr - kw) // sw + 1
    if oh < 1 or ow < 1:
        raise shape_error("a filter no larger than the padded input", shapes)
    # loops: n0 oh1 ow2 f3 kh4 kw5 c6; spatial loops stay whole (a split would need halos)
    d = [AffineExpr.loop(i) for i in range(7)]
    x_map = AffineMap(7, (d[0], d[1] * sh + d[4] + (-pt), d[2] * sw + d[5] + (-pl), d[6]))
    w_map = AffineMap(7, (d[4], d[5], d[6], d[3]))
    out_map = AffineMap(7, (d[0], d[1], d[2], d[3]))
    return LoopNest((n, oh, ow, f, kh, kw, c), (PARALLEL, INVALID, INVALID, PARALLEL, INVALID, INVALID, REDUCTION),
                    (x_map, w_map), (out_map,))


def _conv(inputs: list[np.ndarray], ctx: Context) -> list[np.ndarray]:
    x, w = inputs
    (sh, sw), ((pt, pb), (pl, pr)) = _conv_params(ctx.attrs)
    x = np.pad(x, ((0, 0), (pt, pb), (pl, pr), (0, 0)))
    n, oh, ow, f = ctx.out_shapes[0]
    out = np.zeros((n, oh, ow, f), dtype=np.result_type(x, w))
    for i in range(w.shape[0]):
        for j in range(w.shape[1]):
            window = x[:, i:i + sh * (oh - 1) + 1:sh, j:j + sw * (ow - 1) + 1:sw, :]
            out += np.einsum("nhwc,cf->nhwf", window, w[i, j])
    return [out]


register(OpKind("conv2d", (2, 2), _conv_loops, _conv, lambda n, a: 2.0 * n.points(), attrs=("strides", "padding"),
                doc="NHWC input, [KH, KW, C, F] filter, explicit padding"))
