"""Reductions over dims, and the normalising ops whose normalised dim must not be split."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from autoshard.affine import AffineExpr, AffineMap
from autoshard.ops.loops import INVALID, PARALLEL, REDUCTION, LoopNest
from autoshard.ops.table import (Attrs, Context, OpError, OpKind, Shape, accumulated_dtype, in_accumulated_dtype, int_list_attr,
                                 normalize_dim, register)
from autoshard.reductions import REDUCTIONS


def _reduced_dims(shape: Shape, attrs: Attrs) -> tuple[int, ...]:
    dims = int_list_attr(attrs, "dims", tuple(range(len(shape))))
    norm = tuple(sorted({normalize_dim(d, len(shape), "dims") for d in dims}))
    if len(norm) != len(dims):
        raise OpError(f"attribute 'dims' {list(dims)} names a dim twice", "dims")
    return norm


def _reduce_loops(kind: str):
    def loops(shapes: Sequence[Shape], attrs: Attrs) -> LoopNest:
        (shape,) = shapes
        dims = _reduced_dims(shape, attrs)
        keep = bool(attrs.get("keepdims", False))
        rank = len(shape)
        out = tuple(AffineExpr.constant(0) if d in dims else AffineExpr.loop(d) for d in range(rank) if keep or d not in dims)
        iterators = tuple(REDUCTION if d in dims else PARALLEL for d in range(rank))
        return LoopNest(shape, iterators, (AffineMap.identity(rank),), (AffineMap(rank, out),), kind)
    return loops


def _reduce_compute(kind: str, mean: bool = False):
    def compute(inputs: list[np.ndarray], ctx: Context) -> list[np.ndarray]:
        dims = ctx.nest.reduction_loops
        value = REDUCTIONS[kind].fold(inputs[0], axis=dims, keepdims=True)
        if mean:
            # Divide by the *global* count so that partial sums of a split reduction still add up.
            value = value / float(np.prod([ctx.block.extents[d] for d in dims]))
        return [value.reshape(ctx.out_shapes[0])]
    return compute


for _kind, _reduction in (("reduce_sum", "sum"), ("reduce_max", "max"), ("reduce_min", "min"), ("reduce_mean", "sum")):
    register(OpKind(_kind, (1, 1), _reduce_loops(_reduction),
                    in_accumulated_dtype(_reduce_compute(_reduction, _kind == "reduce_mean")),
                    out_dtypes=accumulated_dtype, attrs=("dims", "keepdims", "dtype"), payload=REDUCTIONS[_reduction].combiner,
                    doc=f"{_kind[7:]} over attribute dims (default all); keepdims keeps them as size 1; result in "
                        f"attribute dtype (default the operand's)"))


def _normalising_loops(param_count: tuple[int, int]):
    """Loops over x's dims with the last one `invalid`; parameters (gamma, beta) index it."""
    def loops(shapes: Sequence[Shape], attrs: Attrs) -> LoopNest:
        x, params = shapes[0], shapes[1:]
        rank = len(x)
        dim = normalize_dim(attrs.get("axis", -1), rank) if rank else 0
        if rank == 0:
            raise OpError("expected an input of rank >= 1")
        for i, p in enumerate(params):
            if p != (x[dim],):
                raise OpError(f"parameter {i + 1} must have shape [{x[dim]}], got {list(p)}")
        iterators = tuple(INVALID if d == dim else PARALLEL for d in range(rank))
        param_map = AffineMap(rank, (AffineExpr.loop(dim),))
        return LoopNest(x, iterators, (AffineMap.identity(rank),) + (param_map,) * len(params), (AffineMap.identity(rank),))
    return loops


def _softmax(inputs: list[np.ndarray], ctx: Context) -> list[np.ndarray]:
    dim = normalize_dim(ctx.attrs.get("axis", -1), inputs[0].ndim)
    x = inputs[0] - np.max(inputs[0], axis=dim, keepdims=True)
    e = np.exp(x)
    return [e / np.sum(e, axis=dim, keepdims=True)]


def _layer_norm(inputs: list[np.ndarray], ctx: Context) -> list[np.ndarray]:
    x, params = inputs[0], inputs[1:]
    dim = normalize_dim(ctx.attrs.get("axis", -1), x.ndim)
    shape = [1] * x.ndim
    shape[dim] = -1
    mean = np.mean(x, axis=dim, keepdims=True)
    var = np.mean(np.square(x - mean), axis=dim, keepdims=True)
    y = (x - mean) / np.sqrt(var + ctx.attrs.get("eps", 1e-5))
    if params:
        y = y * params[0].reshape(shape)
    if len(params) > 1:
        y = y + params[1].reshape(shape)
    return [y]


def _rms_norm(inputs: list[np.ndarray], ctx: Context) -> list[np.ndarray]:
    x, params = inputs[0], inputs[1:]
    dim = normalize_dim(ctx.attrs.get("axis", -1), x.ndim)
    y = x / np.sqrt(np.mean(np.square(x), axis=dim, keepdims=True) + ctx.attrs.get("eps", 1e-6))
    if params:
        shape = [1] * x.ndim
        shape[dim] = -1
        y = y * params[0].reshape(shape)
    return [y]


register(OpKind("softmax", (1, 1), _normalising_loops((0, 0)), _softmax, lambda n, a: 5.0 * n.points(),
                float_only=True, attrs=("axis",), doc="softmax over the dim named by attribute axis (default -1), which cannot be split"))
register(OpKind("layer_norm", (1, 3), _normalising_loops((0, 2)), _layer_norm, lambda n, a: 8.0 * n.points(),
                float_only=True, attrs=("axis", "eps"), doc="layer norm over the dim named by attribute axis, with optional gamma, beta"))
register(OpKind("rms_norm", (1, 2), _normalising_loops((0, 1)), _rms_norm, lambda n, a: 4.0 * n.points(),
                float_only=True, attrs=("axis", "eps"), doc="RMS norm over the dim named by attribute axis, with optional gamma"))
