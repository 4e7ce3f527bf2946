"""Ops that read through windows (`d_out * stride + d_kernel - pad`) as MLIR: convolutions as
linalg's named convolutions, pooling as a `linalg.generic`, the filter gradient, and the
gradient of a pooling whose windows tile the input.

The windows' padding is added with `tensor.pad` on dims the input holds whole. On a dim split
with halos the input is already the device's box (block plus halos, `update_halo` filled them),
whose cells outside the tensor are the padding: zeros. Convolutions and average pooling read
zero padding as they should; max pooling reads every cell outside the tensor as the lowest value,
testing the cell's global position (the block's offset plus the local index) in the loop body.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

from autoshard.affine import AffineExpr, AffineMap
from autoshard.errors import InputError
from autoshard.mlir.linalg import Operand, Spec, empty, generic, ins_outs, linalg_index, reduction_init
from autoshard.mlir.scalar import combine, constant, identity_value
from autoshard.mlir.text import Body, elem_type, int_list
from autoshard.ops.loops import LoopNest
from autoshard.ops.nn import window_params

if TYPE_CHECKING:
    from autoshard.mlir.lower import LoweringContext

CONVOLUTIONS = {1: "linalg.conv_1d_nwc_wcf", 2: "linalg.conv_2d_nhwc_hwcf", 3: "linalg.conv_3d_ndhwc_dhwcf"}


def pad_cells(b: Body, x: Operand, low: Sequence[int], high: Sequence[int], value: str, hint: str) -> Operand:
    """`x` with the scalar `value` added before (`low`) and after (`high`) each dim."""
    grow = [lo + hi for lo, hi in zip(low, high)]
    spec = Spec(tuple(s + g for s, g in zip(x.shape, grow)), x.dtype,
                tuple(s if isinstance(s, str) else s + g for s, g in zip(x.sizes, grow)))
    padded = Operand(b.name(hint), spec)
    b.emit(f"{padded.name} = tensor.pad {x.name} low{int_list(low)} high{int_list(high)} {{")
    b.emit(f"^bb0({', '.join(b.name('p') + ': index' for _ in x.shape)}):")
    b.emit(f"  tensor.yield {value} : {elem_type(x.dtype)}")
    b.emit(f"}} : {x.type} to {padded.type}")
    return padded


def _window_input(b: Body, ctx: LoweringContext, rank: int, attrs: Mapping[str, Any]) -> Operand:
    """Input 0 with zero padding on the spatial dims it holds whole (see the module doc); `attrs`
    are the window op's."""
    x = ctx.inputs[0]
    _, pad = window_params(attrs, rank, attrs.get("window"))
    whole = [not any(ctx.halo(0, d + 1)) for d in range(rank)]
    low = [0] + [a if w else 0 for (a, _), w in zip(pad, whole)] + [0]
    high = [0] + [c if w else 0 for (_, c), w in zip(pad, whole)] + [0]
    if not any(low) and not any(high):
        return x
    return pad_cells(b, x, low, high, constant(b, 0, x.dtype, "zero"), "padded")


def _unpadded(map_: AffineMap) -> AffineMap:
    """The map read on the padded input: the windows start at 0."""
    return AffineMap(map_.num_loops, tuple(AffineExpr(e.terms, 0) for e in map_.results))


def lower_conv(b: Body, ctx: LoweringContext) -> list[Operand]:
    rank = len(ctx.inputs[0].shape) - 2
    strides, _ = window_params(ctx.op.attrs, rank)
    x = _window_input(b, ctx, rank, ctx.op.attrs)
    init = reduction_init(b, ctx.out, "sum")
    result = b.name(ctx.op.outputs[0])
    b.emit(f"{result} = {CONVOLUTIONS[rank]} {{dilations = dense<1> : tensor<{rank}xi64>, "
           f"strides = dense<{int_list(strides)}> : tensor<{rank}xi64>}} "
           f"{ins_outs([x, ctx.inputs[1]], [init])} -> {init.type}")
    return [Operand(result, init.spec)]


def lower_pool(b: Body, ctx: LoweringContext) -> list[Operand]:
    nest, x, out = ctx.op.nest, _window_input(b, ctx, 2, ctx.op.attrs), ctx.out
    is_max = ctx.op.kind == "max_pool2d"
    strides, pad = window_params(ctx.op.attrs, 2, ctx.op.attrs.get("window"))
    kernel = nest.extents[4:6]
    # global first row/column of the block's windows (outside the region: top-level values)
    offsets = [ctx.offset(1), ctx.offset(2)]
    lowest = constant(b, identity_value("max", x.dtype), x.dtype, "lowest") if is_max else None
    scale = None if is_max else constant(b, 1.0 / (kernel[0] * kernel[1]), x.dtype, "inverse_area")

    def region(b: Body, args: list[str], acc: str) -> str:
        if is_max:
            value = _outside_as(b, args[0], lowest, x.dtype, nest, strides, pad, offsets)
            return combine(b, "max", acc, value, x.dtype, ctx.where)
        return combine(b, "sum", acc, combine(b, "product", args[0], scale, x.dtype, ctx.where), x.dtype, ctx.where)

    # The kernel loops appear only inside window sums: an unread [KH, KW] operand gives linalg
    # their extents, as the named pooling ops' window operand does.
    window = empty(b, Spec(tuple(kernel), x.dtype), "window")
    maps = [_unpadded(nest.input_maps[0]), AffineMap(6, (AffineExpr.loop(4), AffineExpr.loop(5))), nest.output_maps[0]]
    iterators = ["parallel"] * 4 + ["reduction"] * 2
    return [generic(b, maps, iterators, [x, window], reduction_init(b, out, "max" if is_max else "sum"), region,
                    hint=ctx.op.outputs[0])]


def _outside_as(b: Body, value: str, lowest: str, dtype: str, nest: LoopNest, strides: Sequence[int],
                pad: Sequence[tuple[int, int]], offsets: Sequence[str | None]) -> str:
    """`value`, or `lowest` where the cell read lies outside the input (rows then columns)."""
    inside = None
    for d in range(2):
        out_index = linalg_index(b, 1 + d, offsets[d])
        kernel_index = b.name(f"k{d}")
        b.emit(f"{kernel_index} = linalg.index {4 + d} : index")
        stride, first = b.name("stride"), b.name("cell")
        b.emit(f"{stride} = arith.constant {strides[d]} : index")
        b.emit(f"{first} = arith.muli {out_index}, {stride} : index")
        cell = b.name("cell")
        b.emit(f"{cell} = arith.addi {first}, {kernel_index} : index")
        low, high = b.name("low"), b.name("high")
        b.emit(f"{low} = arith.constant {pad[d][0]} : index")
        b.emit(f"{high} = arith.constant {pad[d][0] + nest.input_shapes[0][1 + d]} : index")
        above, below = b.name("above"), b.name("below")
        b.emit(f"{above} = arith.cmpi uge, {cell}, {low} : index")
        b.emit(f"{below} = arith.cmpi ult, {cell}, {high} : index")
        both = b.name("inside")
        b.emit(f"{both} = arith.andi {above}, {below} : i1")
        if inside is not None:
            joined = b.name("inside")
            b.emit(f"{joined} = arith.andi {inside}, {both} : i1")
            both = joined
        inside = both
    chosen = b.name("read")
    b.emit(f"{chosen} = arith.select {inside}, {value}, {lowest} : {elem_type(dtype)}")
    return chosen


# --- gradients ----------------------------------------------------------------------------
def conv_filter_grad(b: Body, ctx: LoweringContext, of: str, wrt: int) -> list[Operand]:
    """dw = sum over the batch and the outputs of the window's input times dy: one generic over
    the forward loops, the input read on its padded form."""
    forward = ctx.op.attrs.get("forward", {})
    x = _window_input(b, ctx, len(ctx.inputs[0].shape) - 2, forward)
    dy, nest = ctx.inputs[-1], ctx.op.nest
    iterators = ["reduction" if t == "reduction" else "parallel" for t in nest.iterator_types]

    def region(b: Body, args: list[str], acc: str) -> str:
        return combine(b, "sum", acc, combine(b, "product", args[0], args[1], dy.dtype, ctx.where), dy.dtype, ctx.where)
    maps = [_unpadded(nest.input_maps[0]), nest.input_maps[-1], nest.output_maps[0]]
    return [generic(b, maps, iterators, [x, dy], reduction_init(b, ctx.out, "sum"), region, hint=ctx.op.outputs[0])]


def pool_grad(b: Body, ctx: LoweringContext, of: str, wrt: int) -> list[Operand]:
    """Windows that tile the input (the only pooling gradient `differentiate` makes): the input
    viewed as [N, OH, KH, OW, KW, C]; each cell gets dy where it is its window's maximum (every
    one on a tie), or dy / (KH KW) for the average; then the view is collapsed back."""
    x, dy = ctx.inputs[0], ctx.inputs[-1]
    n, oh, ow, c = dy.shape
    kh, kw = ctx.op.nest.extents[4:6]
    if any(isinstance(s, str) for s in x.sizes + dy.sizes) or x.shape != (n, oh * kh, ow * kw, c):
        raise InputError(f"op {ctx.op.name!r}: the gradient of {of} is lowered for windows tiling a static block; "
                         f"got input {list(x.sizes)} and output gradient {list(dy.sizes)}", ctx.where)
    tiles = Spec((n, oh, kh, ow, kw, c), x.dtype)
    groups = "[[0], [1, 2], [3, 4], [5]]"
    viewed = Operand(b.name("tiles"), tiles)
    b.emit(f"{viewed.name} = tensor.expand_shape {x.name} {groups} output_shape {int_list(tiles.shape)} "
           f": {x.type} into {viewed.type}")
    d = AffineExpr.loop
    cell = AffineMap.identity(6)
    window = AffineMap(6, (d(0), d(1), d(3), d(5)))
    is_max = of == "max_pool2d"
    if is_max:
        top = generic(b, [cell, window], ["parallel", "parallel", "reduction", "parallel", "reduction", "parallel"],
                      [viewed], reduction_init(b, dy.spec, "max"),
                      lambda b, args, acc: combine(b, "max", acc, args[0], x.dtype, ctx.where), hint="window_max")
        zero = constant(b, 0, dy.dtype, "zero")

        def region(b: Body, args: list[str], acc: str) -> str:
            hit = b.name("hit")
            b.emit(f"{hit} = arith.cmpf oeq, {args[0]}, {args[1]} : {elem_type(x.dtype)}")
            picked = b.name("picked")
            b.emit(f"{picked} = arith.select {hit}, {args[2]}, {zero} : {elem_type(dy.dtype)}")
            return picked
        inputs, maps = [viewed, top, dy], [cell, window, window]
    else:
        share = constant(b, 1.0 / (kh * kw), dy.dtype, "inverse_area")
        inputs, maps = [dy], [window]

        def region(b: Body, args: list[str], acc: str) -> str:
            return combine(b, "product", args[0], share, dy.dtype, ctx.where)
    spread = generic(b, maps + [cell], ["parallel"] * 6, inputs, reduction_init(b, Spec(tiles.shape, dy.dtype), "sum"),
                     region, hint="spread")
    result = Operand(b.name(ctx.op.outputs[0]), Spec(x.shape, dy.dtype))
    b.emit(f"{result.name} = tensor.collapse_shape {spread.name} {groups} : {spread.type} into {result.type}")
    return [result]
