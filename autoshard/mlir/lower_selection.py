"""Selection ops as MLIR: `one_hot`, `top_k_values`, `top_k_indices` and the gradient of
`top_k_values`, each as `linalg.generic`s computing what `autoshard.ops.selection` computes.

linalg has no sort, so the k largest are found by rank: the rank of entry n of a row is the
number of entries before it in the order (larger, or equal at a lower position), and pick j of
the row is the entry of rank j. Rows are short (a router's experts), so the quadratic count is
cheap; the selected dim is never split, so its loops are local indices.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autoshard.affine import AffineExpr, AffineMap
from autoshard.dtypes import DTYPES
from autoshard.mlir.linalg import Operand, Spec, empty, generic, linalg_index, reduction_init
from autoshard.mlir.scalar import combine, constant
from autoshard.mlir.text import Body, elem_type

if TYPE_CHECKING:
    from autoshard.mlir.lower import LoweringContext


def _loops(num: int, *loops: int) -> AffineMap:
    return AffineMap(num, tuple(AffineExpr.loop(l) for l in loops))


def _index_as_i64(b: Body, loop: int) -> str:
    name = b.name("n")
    b.emit(f"{name} = arith.index_cast {linalg_index(b, loop, None)} : index to i64")
    return name


def select_scalar(b: Body, hit: str, value: str, otherwise: str, dtype: str) -> str:
    """`hit ? value : otherwise` on scalars of `dtype` inside a region."""
    name = b.name("picked")
    b.emit(f"{name} = arith.select {hit}, {value}, {otherwise} : {elem_type(dtype)}")
    return name


def one_hot(b: Body, ctx: LoweringContext) -> list[Operand]:
    """out[..., c] = ids[...] == c ? 1 : 0."""
    (ids,) = ctx.inputs
    dtype, c_loop = ctx.out.dtype, ctx.op.nest.num_loops - 1
    offset = ctx.offset(c_loop)  # outside the region: it is a top-level value

    def region(b: Body, args: list[str], acc: str) -> str:
        hit = b.name("hit")
        b.emit(f"{hit} = arith.cmpi eq, {args[0]}, {_cast_index(b, c_loop, offset, ids.dtype)} : {elem_type(ids.dtype)}")
        return select_scalar(b, hit, constant(b, 1, dtype, "one"), constant(b, 0, dtype, "zero"), dtype)
    return [generic(b, ctx.op.nest.maps, ["parallel"] * ctx.op.nest.num_loops, [ids], empty(b, ctx.out), region,
                    hint=ctx.op.outputs[0])]


def _cast_index(b: Body, loop: int, offset: str | None, dtype: str) -> str:
    name = b.name("c")
    b.emit(f"{name} = arith.index_cast {linalg_index(b, loop, offset)} : index to {elem_type(dtype)}")
    return name


def _ranks(b: Body, x: Operand) -> Operand:
    """rank[..., n] = #{m : x[m] > x[n], or x[m] == x[n] and m < n} over the last dim, as i64."""
    lead = len(x.shape) - 1
    num = lead + 2  # loops: the leading dims, n, m
    ranks = reduction_init(b, Spec(x.shape, "i64", x.sizes), "sum")
    is_float = DTYPES[x.dtype].is_float
    greater, equal = ("arith.cmpf ogt", "arith.cmpf oeq") if is_float else ("arith.cmpi sgt", "arith.cmpi eq")

    def region(b: Body, args: list[str], acc: str) -> str:
        other, entry = args
        above, same, earlier, before, counted = (b.name(h) for h in ("above", "same", "earlier", "before", "counted"))
        b.emit(f"{above} = {greater}, {other}, {entry} : {elem_type(x.dtype)}")
        b.emit(f"{same} = {equal}, {other}, {entry} : {elem_type(x.dtype)}")
        b.emit(f"{earlier} = arith.cmpi ult, {linalg_index(b, lead + 1, None)}, {linalg_index(b, lead, None)} : index")
        tie = b.name("tie")
        b.emit(f"{tie} = arith.andi {same}, {earlier} : i1")
        b.emit(f"{before} = arith.ori {above}, {tie} : i1")
        b.emit(f"{counted} = arith.extui {before} : i1 to i64")
        return combine(b, "sum", acc, counted, "i64", "")
    maps = [_loops(num, *range(lead), lead + 1), _loops(num, *range(lead), lead), _loops(num, *range(lead), lead)]
    return generic(b, maps, ["parallel"] * (lead + 1) + ["reduction"], [x, x], ranks, region, hint="ranks")


def top_k(b: Body, ctx: LoweringContext) -> list[Operand]:
    """out[..., j] = the entry of rank j (its value, or its position), summed over the row where
    only that entry contributes."""
    (x,) = ctx.inputs
    ranks = _ranks(b, x)
    nest, dtype = ctx.op.nest, ctx.out.dtype
    lead = nest.num_loops - 2  # loops: the leading dims, j, n
    values = ctx.op.kind == "top_k_values"

    def region(b: Body, args: list[str], acc: str) -> str:
        entry, rank = args
        hit = b.name("hit")
        b.emit(f"{hit} = arith.cmpi eq, {rank}, {_index_as_i64(b, lead)} : i64")
        chosen = entry if values else _index_as_i64(b, lead + 1)
        picked = select_scalar(b, hit, chosen, constant(b, 0, dtype, "zero"), dtype)
        return combine(b, "sum", acc, picked, dtype, "")
    maps = [nest.input_maps[0], nest.input_maps[0], nest.output_maps[0]]
    return [generic(b, maps, ["parallel"] * (lead + 1) + ["reduction"], [x, ranks], reduction_init(b, ctx.out, "sum"),
                    region, hint=ctx.op.outputs[0])]


def top_k_values_grad(b: Body, ctx: LoweringContext, of: str, wrt: int) -> list[Operand]:
    """dx[..., n] = dy[..., rank n] if that rank is below k, else 0: a sum over the picks j."""
    x, dy = ctx.inputs
    ranks = _ranks(b, x)
    nest, dtype = ctx.op.nest, ctx.out.dtype
    lead = nest.num_loops - 2  # loops: the leading dims, j, n

    def region(b: Body, args: list[str], acc: str) -> str:
        rank, grad = args
        hit = b.name("hit")
        b.emit(f"{hit} = arith.cmpi eq, {rank}, {_index_as_i64(b, lead)} : i64")
        return combine(b, "sum", acc, select_scalar(b, hit, grad, constant(b, 0, dtype, "zero"), dtype), dtype, "")
    maps = [nest.input_maps[0], nest.input_maps[1], nest.output_maps[0]]
    iterators = ["parallel"] * lead + ["reduction", "parallel"]
    return [generic(b, maps, iterators, [ranks, dy], reduction_init(b, ctx.out, "sum"), region, hint=ctx.op.outputs[0])]
