"""Running reductions and writes at indices as MLIR: `cumulative`, `scatter_add` and `scatter`,
each one `linalg.generic` computing what `autoshard.ops.indexing` computes.

A running reduction folds, for each entry i of its dim, every entry j up to i (from i on, in
reverse): a loop j is added over the dim, and the entries past i fold the reduction's identity.
The dim is never split, so i and j are local indices. A scatter folds over the ids: each id is
compared with the row's global index (its block's offset added), `scatter_add` summing the
matching updates, `scatter` keeping the last (linalg runs a reduction loop in order).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autoshard.affine import AffineExpr, AffineMap
from autoshard.mlir.linalg import Operand, generic, linalg_index, reduction_init
from autoshard.mlir.lower_selection import select_scalar
from autoshard.mlir.scalar import combine, constant, identity_value
from autoshard.mlir.text import Body, elem_type
from autoshard.ops.table import normalize_dim

if TYPE_CHECKING:
    from autoshard.mlir.lower import LoweringContext


def cumulative(b: Body, ctx: LoweringContext) -> list[Operand]:
    (x,) = ctx.inputs
    kind, dtype, rank = ctx.op.attrs["reduction"], ctx.out.dtype, len(x.shape)
    dim = normalize_dim(ctx.op.attrs["axis"], rank)
    # loops: the result's dims, then j over the running dim
    reads = AffineMap(rank + 1, tuple(AffineExpr.loop(rank if d == dim else d) for d in range(rank)))
    writes = AffineMap(rank + 1, tuple(AffineExpr.loop(d) for d in range(rank)))
    reached = "uge" if ctx.op.attrs.get("reverse", False) else "ule"

    def region(b: Body, args: list[str], acc: str) -> str:
        folded = b.name("folded")
        b.emit(f"{folded} = arith.cmpi {reached}, {linalg_index(b, rank, None)}, {linalg_index(b, dim, None)} : index")
        value = select_scalar(b, folded, args[0], constant(b, identity_value(kind, dtype), dtype, "identity"), dtype)
        return combine(b, kind, acc, value, dtype, ctx.where)
    return [generic(b, [reads, writes], ["parallel"] * rank + ["reduction"], [x], reduction_init(b, ctx.out, kind),
                    region, hint=ctx.op.outputs[0])]


def scatter(b: Body, ctx: LoweringContext) -> list[Operand]:
    """Both scatters: loops r (the rows), a row's dims, then the ids' dims (folded)."""
    nest, dtype = ctx.op.nest, ctx.out.dtype
    adds = ctx.op.kind == "scatter_add"
    ids, updates = ctx.inputs[-2:]
    first_row = ctx.offset(0)  # outside the region: it is a top-level value
    init = reduction_init(b, ctx.out, "sum") if adds else ctx.inputs[0]
    num_rows = len(nest.output_maps[0].results)
    iterators = ["parallel"] * num_rows + ["reduction"] * (nest.num_loops - num_rows)

    def region(b: Body, args: list[str], acc: str) -> str:
        row, hit = b.name("row"), b.name("hit")
        b.emit(f"{row} = arith.index_cast {args[0]} : {elem_type(ids.dtype)} to index")
        b.emit(f"{hit} = arith.cmpi eq, {row}, {linalg_index(b, 0, first_row)} : index")
        if not adds:
            return select_scalar(b, hit, args[1], acc, dtype)
        picked = select_scalar(b, hit, args[1], constant(b, 0, dtype, "zero"), dtype)
        return combine(b, "sum", acc, picked, dtype, ctx.where)
    maps = [*nest.input_maps[-2:], nest.output_maps[0]]
    return [generic(b, maps, iterators, [ids, updates], init, region, hint=ctx.op.outputs[0])]
