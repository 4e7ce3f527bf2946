"""Running reductions and writes at indices: `cumulative` (cumsum, cumprod, cummax, cummin along
a dim), `scatter_add` (rows of updates summed into the rows their ids name: an embedding's
gradient, a mixture-of-experts combine) and `scatter` (rows written at their ids).

A running reduction's dim is `invalid`: each entry needs every earlier one. The ids of a scatter
index the rows loop, which splits as the embedding's vocabulary does: a device holding rows
[r0, r0 + R) writes the ids in its range and ignores the others. The updates' rows loop of
`scatter_add` is a sum (each device adds its share of the updates); `scatter`'s is `invalid` (a
later write must win, wherever it is held).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from autoshard.affine import AffineExpr, AffineMap
from autoshard.ops.loops import INVALID, PARALLEL, REDUCTION, LoopNest
from autoshard.ops.table import Attrs, Context, OpError, OpKind, Shape, int_attr, normalize_dim, register, shape_error

# the running reductions: reduction kind -> numpy's accumulate
ACCUMULATE = {"sum": np.cumsum, "product": np.cumprod, "max": np.maximum.accumulate, "min": np.minimum.accumulate}


def _loops(num: int, *loops: int) -> AffineMap:
    return AffineMap(num, tuple(AffineExpr.loop(l) for l in loops))


# --- cumulative ------------------------------------------------------------------------------
def _running_dim(shape: Shape, attrs: Attrs) -> int:
    if attrs.get("reduction") not in ACCUMULATE:
        raise OpError(f"attribute 'reduction' must be one of {sorted(ACCUMULATE)}, got {attrs.get('reduction')!r}",
                      "reduction")
    if not shape:
        raise OpError("expected an input of rank >= 1")
    return normalize_dim(int_attr(attrs, "axis"), len(shape))


def _cumulative_loops(shapes: Sequence[Shape], attrs: Attrs) -> LoopNest:
    (shape,) = shapes
    dim = _running_dim(shape, attrs)
    rank = len(shape)
    return LoopNest(tuple(shape), tuple(INVALID if d == dim else PARALLEL for d in range(rank)),
                    (AffineMap.identity(rank),), (AffineMap.identity(rank),))


def _cumulative(inputs: list[np.ndarray], ctx: Context) -> list[np.ndarray]:
    (x,) = inputs
    dim = _running_dim(x.shape, ctx.attrs)
    accumulate = ACCUMULATE[ctx.attrs["reduction"]]
    if ctx.attrs.get("reverse", False):
        return [np.flip(accumulate(np.flip(x, dim), axis=dim), dim)]
    return [accumulate(x, axis=dim)]


register(OpKind("cumulative", (1, 1), _cumulative_loops, _cumulative, attrs=("axis", "reduction", "reverse"),
                doc="the running reduction (sum, product, max, min) along attribute axis, from its end with "
                    "reverse; that dim cannot be split"))


# --- scatter ---------------------------------------------------------------------------------
def _scatter_loops(kind: str):
    """Loops: r over the result's rows (parallel), the rows' other dims (parallel), then the
    ids' dims (a sum for scatter_add, invalid for scatter). The inputs are (operand,) ids and
    updates [ids.., rest..]; the result is [rows, rest..]."""
    def loops(shapes: Sequence[Shape], attrs: Attrs) -> LoopNest:
        if kind == "scatter":
            operand, ids, updates = shapes
            if not operand:
                raise shape_error("operand [R, ...], ids [...] and updates [..., ...]", shapes)
            rows, rest = operand[0], tuple(operand[1:])
        else:
            ids, updates = shapes
            rows, rest = int_attr(attrs, "rows"), tuple(updates[len(ids):])
            if rows < 1:
                raise OpError(f"attribute 'rows' must be positive, got {rows}", "rows")
        if tuple(updates) != tuple(ids) + rest:
            raise shape_error("updates shaped as the ids followed by a row's dims", shapes)
        n_rest, n_ids = len(rest), len(ids)
        num = 1 + n_rest + n_ids
        row_loops, id_loops = range(1, 1 + n_rest), range(1 + n_rest, num)
        maps = (_loops(num, *id_loops), _loops(num, *id_loops, *row_loops))
        if kind == "scatter":
            maps = (_loops(num, 0, *row_loops),) + maps
        spread = REDUCTION if kind == "scatter_add" else INVALID
        return LoopNest((rows,) + rest + tuple(ids), (PARALLEL,) * (1 + n_rest) + (spread,) * n_ids, maps,
                        (_loops(num, 0, *row_loops),))
    return loops


def _local_ids(ids: np.ndarray, ctx: Context) -> tuple[np.ndarray, np.ndarray]:
    """The ids as rows of this block, and which of them fall in it."""
    local = ids.astype(np.int64) - ctx.block.starts[0]
    hit = (local >= 0) & (local < ctx.out_shapes[0][0])
    return local[hit], hit


def _scatter_add(inputs: list[np.ndarray], ctx: Context) -> list[np.ndarray]:
    ids, updates = inputs
    out = np.zeros(ctx.out_shapes[0], updates.dtype)
    rows, hit = _local_ids(ids, ctx)
    np.add.at(out, rows, updates[hit])
    return [out]


def _scatter(inputs: list[np.ndarray], ctx: Context) -> list[np.ndarray]:
    operand, ids, updates = inputs
    out = operand.copy()
    rows, hit = _local_ids(ids, ctx)
    out[rows] = updates[hit]  # of repeated ids, the last write wins
    return [out]


def _id_dtype(position: int, out: int):
    def dtypes(in_dtypes: Sequence[str], attrs: Attrs) -> tuple[str, ...]:
        if in_dtypes[position] not in ("i32", "i64"):
            raise OpError(f"ids must be i32 or i64, got {in_dtypes[position]}")
        return (in_dtypes[out],)
    return dtypes


def _one_add_per_update(nest: LoopNest, attrs: Attrs) -> float:
    return float(nest.points() // nest.extents[0])


register(OpKind("scatter_add", (2, 2), _scatter_loops("scatter_add"), _scatter_add, _one_add_per_update,
                _id_dtype(0, 1), attrs=("rows",),
                doc="out [rows, ...] = the sum of the updates [ids.., ...] whose ids name each row (ids outside "
                    "[0, rows) are dropped); splitting the ids sums partial results"))
register(OpKind("scatter", (3, 3), _scatter_loops("scatter"), _scatter, lambda nest, attrs: 0.0, _id_dtype(1, 0),
                doc="operand [R, ...] with the rows its ids [...] name replaced by updates [ids.., ...] (ids outside "
                    "[0, R) are dropped; of repeated ids, the last wins)"))
