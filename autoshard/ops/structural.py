"""Data movement: transpose, reshape, broadcast_in_dim, concat, slice, embedding lookup, and `iota`
(the indices along one dim, made from nothing)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from autoshard.affine import AffineExpr, AffineMap
from autoshard.dtypes import DTYPES
from autoshard.ops.loops import INVALID, PARALLEL, REDUCTION, LoopNest
from autoshard.ops.table import (Attrs, Context, OpError, OpKind, Shape, int_list_attr, normalize_dim,
                                 prod, register, shape_error)


def _no_flops(nest: LoopNest, attrs: Attrs) -> float:
    return 0.0


# --- transpose -------------------------------------------------------------------------
def _transpose_loops(shapes: Sequence[Shape], attrs: Attrs) -> LoopNest:
    (shape,) = shapes
    perm = int_list_attr(attrs, "perm", tuple(reversed(range(len(shape)))))
    if sorted(perm) != list(range(len(shape))):
        raise OpError(f"attribute 'perm' {list(perm)} is not a permutation of the {len(shape)} dims", "perm")
    out = tuple(shape[p] for p in perm)
    inverse = [perm.index(d) for d in range(len(shape))]
    return LoopNest(out, (PARALLEL,) * len(out), (AffineMap(len(out), tuple(AffineExpr.loop(i) for i in inverse)),),
                    (AffineMap.identity(len(out)),))


def _transpose(inputs: list[np.ndarray], ctx: Context) -> list[np.ndarray]:
    return [np.transpose(inputs[0], int_list_attr(ctx.attrs, "perm", tuple(reversed(range(inputs[0].ndim)))))]


register(OpKind("transpose", (1, 1), _transpose_loops, _transpose, _no_flops, attrs=("perm",),
                doc="out dim i = in dim perm[i] (numpy.transpose)"))


# --- reshape ---------------------------------------------------------------------------
def reshape_loops(src: Shape, dst: Shape) -> tuple[tuple[int, ...], AffineMap, AffineMap]:
    """Common refinement of two shapes: loops whose runs merge into every dim of both.

    It exists when the prefix products of both shapes, taken together, each divide the next
    (a reshape that only splits and merges dims).
    """
    if prod(src) != prod(dst):
        raise OpError(f"cannot reshape {list(src)} ({prod(src)} elements) to {list(dst)} ({prod(dst)} elements)", "shape")
    cuts = sorted({p for shape in (src, dst) for p in _prefix_products(shape)})
    for a, b in zip(cuts, cuts[1:]):
        if b % a:
            raise OpError(f"reshape {list(src)} -> {list(dst)} is not a split/merge of dims", "shape")
    extents, prev = [], 1
    for c in cuts:
        if c != prev:
            extents.append(c // prev)
        prev = c
    return tuple(extents), _merge_map(src, extents), _merge_map(dst, extents)


def _prefix_products(shape: Shape) -> list[int]:
    out, acc = [], 1
    for s in shape:
        acc *= s
        out.append(acc)
    return out


def _merge_map(shape: Shape, extents: Sequence[int]) -> AffineMap:
    exprs, loop = [], 0
    for size in shape:
        expr, covered = AffineExpr(), 1
        start = loop
        while covered < size:
            covered *= extents[loop]
            loop += 1
        stride = 1
        for l in reversed(range(start, loop)):
            expr = expr + AffineExpr.loop(l, stride)
            stride *= extents[l]
        exprs.append(expr if start != loop else AffineExpr.constant(0))
    return AffineMap(len(extents), tuple(exprs))


def _reshape_loops(shapes: Sequence[Shape], attrs: Attrs) -> LoopNest:
    (shape,) = shapes
    dst = int_list_attr(attrs, "shape")
    if any(d < 0 for d in dst):
        raise OpError(f"attribute 'shape' {list(dst)} has a negative dim", "shape")
    extents, src_map, dst_map = reshape_loops(shape, dst)
    return LoopNest(extents, (PARALLEL,) * len(extents), (src_map,), (dst_map,))


def _reshape(inputs: list[np.ndarray], ctx: Context) -> list[np.ndarray]:
    return [inputs[0].reshape(ctx.out_shapes[0])]


register(OpKind("reshape", (1, 1), _reshape_loops, _reshape, _no_flops, attrs=("shape",), view=True,
                doc="row-major reshape that splits and merges dims"))


# --- broadcast_in_dim ------------------------------------------------------------------
def _broadcast_loops(shapes: Sequence[Shape], attrs: Attrs) -> LoopNest:
    (shape,) = shapes
    out = int_list_attr(attrs, "shape")
    dims = int_list_attr(attrs, "broadcast_dimensions", tuple(range(len(out) - len(shape), len(out))))
    if len(dims) != len(shape) or len(set(dims)) != len(dims) or any(not 0 <= d < len(out) for d in dims):
        raise OpError(f"broadcast_dimensions {list(dims)} must give each of the {len(shape)} input dims a distinct output dim", "broadcast_dimensions")
    exprs = []
    for size, d in zip(shape, dims):
        if size not in (1, out[d]):
            raise OpError(f"input dim of size {size} cannot broadcast to output dim {d} of size {out[d]}", "shape")
        exprs.append(AffineExpr.constant(0) if size == 1 and out[d] != 1 else AffineExpr.loop(d))
    return LoopNest(out, (PARALLEL,) * len(out), (AffineMap(len(out), tuple(exprs)),), (AffineMap.identity(len(out)),))


def _broadcast(inputs: list[np.ndarray], ctx: Context) -> list[np.ndarray]:
    out = ctx.out_shapes[0]
    dims = int_list_attr(ctx.attrs, "broadcast_dimensions", tuple(range(len(out) - inputs[0].ndim, len(out))))
    expanded = [1] * len(out)
    for size, d in zip(inputs[0].shape, dims):
        expanded[d] = size
    return [np.broadcast_to(inputs[0].reshape(expanded), out).copy()]


register(OpKind("broadcast_in_dim", (1, 1), _broadcast_loops, _broadcast, _no_flops,
                attrs=("shape", "broadcast_dimensions"), view=True,
                doc="input dim i becomes output dim broadcast_dimensions[i]"))


# --- concat ----------------------------------------------------------------------------
def _concat_loops(shapes: Sequence[Shape], attrs: Attrs) -> LoopNest:
    rank = len(shapes[0])
    dim = normalize_dim(attrs.get("axis", 0), rank)
    for s in shapes:
        if len(s) != rank or any(a != b for i, (a, b) in enumerate(zip(s, shapes[0])) if i != dim):
            raise shape_error(f"inputs equal in every dim but {dim}", shapes)
    out = list(shapes[0])
    out[dim] = sum(s[dim] for s in shapes)
    maps, offset = [], 0
    for s in shapes:
        # Input i is read where the concat loop is in [offset, offset + size): index d - offset.
        maps.append(AffineMap(rank, tuple(AffineExpr.loop(d) + (-offset if d == dim else 0) for d in range(rank))))
        offset += s[dim]
    iterators = tuple(INVALID if d == dim else PARALLEL for d in range(rank))
    return LoopNest(tuple(out), iterators, tuple(maps), (AffineMap.identity(rank),))


def _concat(inputs: list[np.ndarray], ctx: Context) -> list[np.ndarray]:
    return [np.concatenate(inputs, axis=normalize_dim(ctx.attrs.get("axis", 0), inputs[0].ndim))]


register(OpKind("concat", (1, None), _concat_loops, _concat, _no_flops, attrs=("axis",),
                doc="concatenate along the dim named by attribute axis, which cannot be split"))


# --- slice -----------------------------------------------------------------------------
def _slice_params(shape: Shape, attrs: Attrs) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    starts = int_list_attr(attrs, "starts", (0,) * len(shape))
    limits = int_list_attr(attrs, "limits", shape)
    strides = int_list_attr(attrs, "strides", (1,) * len(shape))
    for name, v in (("starts", starts), ("limits", limits), ("strides", strides)):
        if len(v) != len(shape):
            raise OpError(f"attribute {name!r} needs {len(shape)} values, got {len(v)}", name)
    for d, (a, b, s, n) in enumerate(zip(starts, limits, strides, shape)):
        if not (0 <= a < b <= n) or s < 1:
            raise OpError(f"dim {d}: need 0 <= start < limit <= {n} and stride >= 1, got {a}:{b}:{s}", "starts")
    return starts, limits, strides


def _slice_loops(shapes: Sequence[Shape], attrs: Attrs) -> LoopNest:
    (shape,) = shapes
    starts, limits, strides = _slice_params(shape, attrs)
    out = tuple(-(-(b - a) // s) for a, b, s in zip(starts, limits, strides))
    exprs = tuple(AffineExpr.loop(d, s) + a for d, (a, s) in enumerate(zip(starts, strides)))
    iterators = tuple(PARALLEL if (a, s, o) == (0, 1, n) else INVALID for a, s, o, n in zip(starts, strides, out, shape))
    return LoopNest(out, iterators, (AffineMap(len(shape), exprs),), (AffineMap.identity(len(shape)),))


def _slice(inputs: list[np.ndarray], ctx: Context) -> list[np.ndarray]:
    # The input arrives already cut to [start, last read]; only the stride remains.
    strides = ctx.attrs.get("strides") or [1] * inputs[0].ndim
    return [inputs[0][tuple(slice(None, None, s) for s in strides)]]


register(OpKind("slice", (1, 1), _slice_loops, _slice, _no_flops, attrs=("starts", "limits", "strides"),
                doc="static strided slice; sliced dims cannot be split"))


# --- pad ------------------------------------------------------------------------------
def _pad_params(shape: Shape, attrs: Attrs) -> tuple[tuple[int, ...], tuple[int, ...]]:
    low = int_list_attr(attrs, "low", (0,) * len(shape))
    high = int_list_attr(attrs, "high", (0,) * len(shape))
    for name, v in (("low", low), ("high", high)):
        if len(v) != len(shape) or min(v, default=0) < 0:
            raise OpError(f"attribute {name!r} needs {len(shape)} non-negative values, got {list(v)}", name)
    return low, high


def _pad_loops(shapes: Sequence[Shape], attrs: Attrs) -> LoopNest:
    (shape,) = shapes
    low, high = _pad_params(shape, attrs)
    out = tuple(n + a + b for n, a, b in zip(shape, low, high))
    # The input is read at d - low where the loop is in [low, low + n): padded dims stay whole.
    exprs = tuple(AffineExpr.loop(d) + (-a) for d, a in enumerate(low))
    iterators = tuple(INVALID if a or b else PARALLEL for a, b in zip(low, high))
    return LoopNest(out, iterators, (AffineMap(len(shape), exprs),), (AffineMap.identity(len(shape)),))


def _pad(inputs: list[np.ndarray], ctx: Context) -> list[np.ndarray]:
    low, high = _pad_params(inputs[0].shape, ctx.attrs)  # padded dims are whole in every block
    return [np.pad(inputs[0], list(zip(low, high)))]


register(OpKind("pad", (1, 1), _pad_loops, _pad, _no_flops, attrs=("low", "high"),
                doc="zeros added before (low) and after (high) each dim; padded dims cannot be split"))


# --- reverse --------------------------------------------------------------------------
def _reverse_dims(shape: Shape, attrs: Attrs) -> set[int]:
    return {normalize_dim(d, len(shape), "dims") for d in int_list_attr(attrs, "dims")}


def _reverse_loops(shapes: Sequence[Shape], attrs: Attrs) -> LoopNest:
    (shape,) = shapes
    dims = _reverse_dims(shape, attrs)
    # Output index i reads input index n - 1 - i: a reversed dim's blocks swap ends, so it stays whole.
    exprs = tuple(AffineExpr.loop(d, -1) + (n - 1) if d in dims else AffineExpr.loop(d) for d, n in enumerate(shape))
    iterators = tuple(INVALID if d in dims else PARALLEL for d in range(len(shape)))
    return LoopNest(tuple(shape), iterators, (AffineMap(len(shape), exprs),), (AffineMap.identity(len(shape)),))


def _reverse(inputs: list[np.ndarray], ctx: Context) -> list[np.ndarray]:
    return [np.flip(inputs[0], sorted(_reverse_dims(inputs[0].shape, ctx.attrs)))]


register(OpKind("reverse", (1, 1), _reverse_loops, _reverse, _no_flops, attrs=("dims",), payload="copy",
                doc="the input with the dims listed in attribute dims in reverse order; those dims cannot be split"))


# --- embedding -------------------------------------------------------------------------
def _embedding_loops(shapes: Sequence[Shape], attrs: Attrs) -> LoopNest:
    ids, table = shapes
    if len(table) != 2:
        raise shape_error("ids [...] and a table [V, D]", shapes)
    r = len(ids)
    # loops: the ids dims, then d (parallel), then v (a sum of one-hot lookups: vocab-parallel)
    n = r + 2
    return LoopNest(tuple(ids) + (table[1], table[0]), (PARALLEL,) * (r + 1) + (REDUCTION,),
                    (AffineMap(n, tuple(AffineExpr.loop(i) for i in range(r))),
                     AffineMap(n, (AffineExpr.loop(r + 1), AffineExpr.loop(r)))),
                    (AffineMap(n, tuple(AffineExpr.loop(i) for i in range(r + 1))),))


def _embedding(inputs: list[np.ndarray], ctx: Context) -> list[np.ndarray]:
    ids, table = inputs
    v_loop = len(ctx.nest.extents) - 1
    first = ctx.block.starts[v_loop]
    local = ids.astype(np.int64) - first
    hit = (local >= 0) & (local < table.shape[0])
    rows = table[np.clip(local, 0, table.shape[0] - 1)]
    return [np.where(hit[..., None], rows, np.zeros((), table.dtype))]


def _embedding_dtype(in_dtypes: Sequence[str], attrs: Attrs) -> tuple[str, ...]:
    if in_dtypes[0] not in ("i32", "i64"):
        raise OpError(f"ids must be i32 or i64, got {in_dtypes[0]}")
    return (in_dtypes[1],)


register(OpKind("embedding", (2, 2), _embedding_loops, _embedding, _no_flops, _embedding_dtype,
                doc="rows of table [V, D] picked by integer ids; splitting V sums masked lookups"))


# --- iota ------------------------------------------------------------------------------
def _iota_loops(shapes: Sequence[Shape], attrs: Attrs) -> LoopNest:
    out = int_list_attr(attrs, "shape")
    normalize_dim(attrs.get("dimension", 0), len(out), "dimension")
    return LoopNest(out, (PARALLEL,) * len(out), (), (AffineMap.identity(len(out)),))


def _iota(inputs: list[np.ndarray], ctx: Context) -> list[np.ndarray]:
    # The block's own indices: a device holding rows [start, stop) numbers them globally.
    out = ctx.out_shapes[0]
    dim = normalize_dim(ctx.attrs.get("dimension", 0), len(out), "dimension")
    start = ctx.block.starts[dim]
    ramp = np.arange(start, start + out[dim]).reshape([-1 if d == dim else 1 for d in range(len(out))])
    return [np.broadcast_to(ramp, out).astype(DTYPES[ctx.attrs["dtype"]].numpy)]


def _iota_dtype(in_dtypes: Sequence[str], attrs: Attrs) -> tuple[str, ...]:
    if attrs.get("dtype") not in DTYPES:
        raise OpError(f"attribute 'dtype' must be one of {sorted(DTYPES)}, got {attrs.get('dtype')!r}", "dtype")
    return (attrs["dtype"],)


register(OpKind("iota", (0, 0), _iota_loops, _iota, _no_flops, _iota_dtype, attrs=("shape", "dimension", "dtype"),
                doc="a tensor of attribute shape holding each element's index along attribute dimension"))
