"""Selection by value: the k largest entries of the last dim (`top_k_values`, `top_k_indices`)
and indices spread into one-hot rows (`one_hot`) — what a mixture-of-experts router needs to
turn its probabilities into per-expert combine weights.

The selected dim (and the class dim of `one_hot`) is `invalid`: picking the k largest needs the
whole row, and a device holding some classes would need their global offset. The other dims
are independent rows, so they split freely.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from autoshard.affine import AffineExpr, AffineMap
from autoshard.dtypes import DTYPES
from autoshard.ops.loops import INVALID, PARALLEL, LoopNest
from autoshard.ops.table import Attrs, Context, OpError, OpKind, Shape, int_attr, register, shape_error


def _loops(num: int, *loops: int) -> AffineMap:
    return AffineMap(num, tuple(AffineExpr.loop(l) for l in loops))


# --- top k ----------------------------------------------------------------------------------
def _top_k_loops(shapes: Sequence[Shape], attrs: Attrs) -> LoopNest:
    """Loops: the leading dims (parallel), then j over the k picks and n over the row (invalid)."""
    (shape,) = shapes
    if not shape:
        raise shape_error("a tensor of rank >= 1 (the k largest of its last dim are picked)", shapes)
    k = int_attr(attrs, "k")
    if not 1 <= k <= shape[-1]:
        raise OpError(f"attribute 'k' = {k} must be in [1, {shape[-1]}] (the size of the last dim)", "k")
    lead = len(shape) - 1
    num = lead + 2
    return LoopNest(tuple(shape[:-1]) + (k, shape[-1]), (PARALLEL,) * lead + (INVALID, INVALID),
                    (_loops(num, *range(lead), lead + 1),), (_loops(num, *range(lead), lead),))


def top_k_order(x: np.ndarray, k: int) -> np.ndarray:
    """Positions of the k largest entries of each row, largest first (ties: lower position first)."""
    return np.argsort(-x, axis=-1, kind="stable")[..., :k]


def _top_k_values(inputs: list[np.ndarray], ctx: Context) -> list[np.ndarray]:
    (x,) = inputs
    return [np.take_along_axis(x, top_k_order(x, ctx.attrs["k"]), axis=-1)]


def _top_k_indices(inputs: list[np.ndarray], ctx: Context) -> list[np.ndarray]:
    return [top_k_order(inputs[0], ctx.attrs["k"]).astype(np.int64)]


def _one_compare_per_entry(nest: LoopNest, attrs: Attrs) -> float:
    return float(nest.points() // nest.extents[-2])


register(OpKind("top_k_values", (1, 1), _top_k_loops, _top_k_values, _one_compare_per_entry, attrs=("k",),
                doc="the k largest entries of the last dim, largest first (torch.topk's values)"))
register(OpKind("top_k_indices", (1, 1), _top_k_loops, _top_k_indices, _one_compare_per_entry,
                lambda in_dtypes, attrs: ("i64",), attrs=("k",),
                doc="the positions in the last dim of its k largest entries, largest first (torch.topk's indices), as i64"))


# --- one hot ------------------------------------------------------------------------------
def _one_hot_loops(shapes: Sequence[Shape], attrs: Attrs) -> LoopNest:
    """Loops: the ids' dims (parallel), then c over the classes (invalid)."""
    (ids,) = shapes
    classes = int_attr(attrs, "num_classes")
    if classes < 1:
        raise OpError(f"attribute 'num_classes' must be positive, got {classes}", "num_classes")
    num = len(ids) + 1
    return LoopNest(tuple(ids) + (classes,), (PARALLEL,) * len(ids) + (INVALID,),
                    (_loops(num, *range(len(ids))),), (AffineMap.identity(num),))


def _one_hot(inputs: list[np.ndarray], ctx: Context) -> list[np.ndarray]:
    (ids,) = inputs
    classes = np.arange(ctx.attrs["num_classes"])
    return [(ids[..., None] == classes).astype(DTYPES[ctx.attrs["dtype"]].numpy)]


def _one_hot_dtype(in_dtypes: Sequence[str], attrs: Attrs) -> tuple[str, ...]:
    if in_dtypes[0] not in ("i32", "i64"):
        raise OpError(f"ids must be i32 or i64, got {in_dtypes[0]}")
    if attrs.get("dtype") not in DTYPES:
        raise OpError(f"attribute 'dtype' must be one of {sorted(DTYPES)}, got {attrs.get('dtype')!r}", "dtype")
    return (attrs["dtype"],)


register(OpKind("one_hot", (1, 1), _one_hot_loops, _one_hot, lambda nest, attrs: 0.0, _one_hot_dtype,
                attrs=("num_classes", "dtype"),
                doc="out[..., c] = 1 where ids[...] == c, else 0, in attribute dtype (ids outside [0, num_classes) give a zero row)"))
