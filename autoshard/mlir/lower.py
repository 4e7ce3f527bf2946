"""Graph ops as real MLIR: one lowering per op kind, in one table.

An op whose meaning is one loop nest with a scalar payload (elementwise ops, casts,
contractions, reductions, `generic`) becomes a `linalg.generic` with the op's own indexing maps
and iterator types, or the named linalg op where one fits (`linalg.matmul`,
`linalg.batch_matmul`). The other kinds become the `linalg`/`tensor` named op that exists
(`linalg.softmax`, `linalg.transpose`, `tensor.expand_shape`/`collapse_shape`, `tensor.concat`,
`tensor.extract_slice`, linalg's convolutions) or a short sequence of `linalg.generic`s;
window ops (convolution, pooling) are in `lower_window`, selections (`one_hot`, `top_k_*`) in
`lower_selection`, running reductions and scatters in `lower_indexing`;
`grad` ops are lowered per forward kind in `lower_grad`.

Lowering reads operand and result shapes from the caller, so the same code prints the global op
(annotated IR) and one device's local op (partitioned IR, shapes of the device's buffers). Ops
whose result depends on global positions (an embedding's vocabulary index, a causal mask's query
index) ask the caller for the block's first global index of that loop (`LoweringContext.offset`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

from autoshard.affine import AffineExpr, AffineMap
from autoshard.dtypes import DTYPES
from autoshard.errors import InputError
from autoshard.graph.model import Op
from autoshard.mlir.linalg import (Operand, Spec, empty, generic, ins_outs, layout_position, linalg_index,
                                   reduction_init)
from autoshard.mlir.lower_grad import lower_grad
from autoshard.mlir.lower_indexing import cumulative, scatter
from autoshard.mlir.lower_window import lower_conv, lower_pool, pad_cells
from autoshard.mlir.lower_selection import one_hot, top_k
from autoshard.mlir.scalar import combine, constant, convert, payload
from autoshard.mlir.text import Body, elem_type, int_list
from autoshard.ops.loops import PARALLEL, REDUCTION
from autoshard.ops.nn import BALANCED, KEY_LOOP, QUERY_LOOP
from autoshard.ops.payloads import PAYLOADS
from autoshard.ops.table import accumulated_dtype, normalize_dim


@dataclass(frozen=True)
class LoweringContext:
    op: Op
    inputs: tuple[Operand, ...]
    outputs: tuple[Spec, ...]
    extents: tuple[int, ...]  # loop extents of the computed block (global ones for the whole op)
    offset: Callable[[int], str | None]  # first global index of a loop's block as an SSA index; None: 0
    # Per input, the (start, end) halo of each dim its value holds (none in the global op).
    input_halos: tuple[tuple[tuple[int, int], ...], ...] = ()
    # An all_reduce of a value over the mesh axes of the op's split combined loop (attention's
    # keys), given the reduction kind and a name hint; None where no such loop is split.
    all_reduce: Callable[[Body, Operand, str, str], Operand] | None = None

    def halo(self, index: int, dim: int) -> tuple[int, int]:
        halos = self.input_halos[index] if index < len(self.input_halos) else ()
        return halos[dim] if dim < len(halos) else (0, 0)

    @property
    def where(self) -> str:
        return f"/ops/{self.op.name}"

    @property
    def out(self) -> Spec:
        return self.outputs[0]

    def require_float(self) -> None:
        bad = [o.dtype for o in self.inputs[:1] if not DTYPES[o.dtype].is_float]
        if bad:
            raise InputError(f"op {self.op.name!r} ({self.op.kind}) is only lowered on floating-point values, got {bad[0]}",
                             self.where)


Lowering = Callable[[Body, LoweringContext], list[Operand]]


def _loops(n: int, *loops: int) -> AffineMap:
    return AffineMap(n, tuple(AffineExpr.loop(l) for l in loops))


def _linalg_iterators(op: Op) -> list[str]:
    """linalg's iterator of each loop: an `invalid` loop is parallel if it indexes a result."""
    nest = op.nest
    out_loops = {l for m in nest.output_maps for e in m.results for l in e.loops}
    return ["reduction" if t == REDUCTION or (t != PARALLEL and l not in out_loops) else "parallel"
            for l, t in enumerate(nest.iterator_types)]


# --- payload loop nests -----------------------------------------------------------------

def _payload_nest(b: Body, ctx: LoweringContext, name: str | None = None) -> list[Operand]:
    """The op's loop nest as one linalg.generic: payload in the first input's dtype (in the
    result's, for a result written in a wider float than its operands: a bf16 GEMM accumulating
    in f32 multiplies exactly), then converted to the result's dtype and folded with the
    reduction kind over reduction loops."""
    op, nest, out = ctx.op, ctx.op.nest, ctx.out
    name = name or op.op_kind.payload_of(op.attrs)
    if name is None:
        raise InputError(f"op kind {op.kind!r} has no MLIR lowering yet", ctx.where)
    reductions = bool(nest.reduction_loops)
    fold = reductions and PAYLOADS[name].arity == len(ctx.inputs) + 1  # the payload is the combiner
    in_dtype = ctx.inputs[0].dtype if ctx.inputs and op.op_kind.out_dtypes is not accumulated_dtype else out.dtype
    init = reduction_init(b, out, nest.reduction_kind) if reductions else empty(b, out)

    def region(b: Body, args: list[str], acc: str) -> str:
        if fold:
            return payload(b, name, [convert(b, args[0], ctx.inputs[0].dtype, out.dtype), acc], out.dtype, ctx.where)
        values = [convert(b, a, o.dtype, in_dtype) for a, o in zip(args, ctx.inputs)]
        value = convert(b, payload(b, name, values, in_dtype, ctx.where), in_dtype, out.dtype)
        return combine(b, nest.reduction_kind, acc, value, out.dtype, ctx.where) if reductions else value

    return [generic(b, nest.maps, _linalg_iterators(op), ctx.inputs, init, region, hint=op.outputs[0])]


def _named_contraction(named: str, lhs_rank: int) -> Lowering:
    def lower(b: Body, ctx: LoweringContext) -> list[Operand]:
        lhs, rhs = ctx.inputs
        if len(lhs.shape) != lhs_rank or len({lhs.dtype, rhs.dtype, ctx.out.dtype}) != 1:
            return _payload_nest(b, ctx)
        init = reduction_init(b, ctx.out, "sum")
        result = b.name(ctx.op.outputs[0])
        b.emit(f"{result} = {named} {ins_outs(ctx.inputs, [init])} -> {init.type}")
        return [Operand(result, init.spec)]
    return lower


def _elementwise(b: Body, inputs: Sequence[Operand], out: Spec, fn: Callable[[Body, list[str]], str], hint: str,
                 maps: Sequence[AffineMap] | None = None) -> Operand:
    """A parallel linalg.generic writing `out`: inputs read through `maps` (default identity)."""
    rank = len(out.shape)
    maps = list(maps) if maps is not None else [AffineMap.identity(rank)] * len(inputs)
    return generic(b, maps + [AffineMap.identity(rank)], ["parallel"] * rank, inputs, empty(b, out),
                   lambda b, args, acc: fn(b, args), hint=hint)


def elementwise_like(b: Body, inputs: Sequence[Operand], fn: Callable[[Body, list[str]], str], hint: str) -> Operand:
    """A parallel linalg.generic over values of one shape, writing that shape."""
    return _elementwise(b, inputs, inputs[0].spec, fn, hint)


def _reduce_mean(b: Body, ctx: LoweringContext) -> list[Operand]:
    (total,) = _payload_nest(b, ctx)
    count = math.prod(ctx.op.nest.extents[l] for l in ctx.op.nest.reduction_loops)  # global: partial means add up
    dtype = ctx.out.dtype

    def divide(b: Body, args: list[str]) -> str:
        return payload(b, "div", [args[0], constant(b, count, dtype, "count")], dtype, ctx.where)
    return [_elementwise(b, [total], ctx.out, divide, ctx.op.outputs[0])]


# --- normalisations and attention ---------------------------------------------------------

def _softmax(b: Body, ctx: LoweringContext) -> list[Operand]:
    (x,) = ctx.inputs
    dim = ctx.op.attrs.get("axis", -1) % len(x.shape)
    out = empty(b, x.spec)
    result = b.name(ctx.op.outputs[0])
    b.emit(f"{result} = linalg.softmax dimension({dim}) {ins_outs([x], [out])} -> {out.type}")
    return [Operand(result, x.spec)]


def _sum_over(b: Body, x: Operand, dim: int, square: bool, hint: str) -> Operand:
    """Sum (of squares) of `x` over `dim`, the dim dropped."""
    rank = len(x.shape)
    kept = [d for d in range(rank) if d != dim]
    init = reduction_init(b, x.spec.take(kept), "sum")
    iterators = ["reduction" if d == dim else "parallel" for d in range(rank)]

    def region(b: Body, args: list[str], acc: str) -> str:
        value = payload(b, "square", args, x.dtype, "") if square else args[0]
        return payload(b, "add", [acc, value], x.dtype, "")
    return generic(b, [AffineMap.identity(rank), _loops(rank, *kept)], iterators, [x], init, region, hint=hint)


def _normalise(b: Body, ctx: LoweringContext, centre: bool) -> list[Operand]:
    """layer_norm (`centre`) and rms_norm: y = (x [- mean]) / sqrt(mean of squares + eps) [* gamma] [+ beta]."""
    x, params = ctx.inputs[0], ctx.inputs[1:]
    rank, dtype = len(x.shape), x.dtype
    dim = ctx.op.attrs.get("axis", -1) % rank
    n = ctx.extents[dim]  # the normalised dim is never split
    kept = _loops(rank, *[d for d in range(rank) if d != dim])
    identity = AffineMap.identity(rank)
    eps = ctx.op.attrs.get("eps", 1e-5 if centre else 1e-6)

    def mean(b: Body, total: str) -> str:
        return payload(b, "div", [total, constant(b, n, dtype, "n")], dtype, "")

    if centre:
        total = _sum_over(b, x, dim, False, "sum")
        x = _elementwise(b, [x, total], x.spec, lambda b, a: payload(b, "sub", [a[0], mean(b, a[1])], dtype, ""),
                         "centred", [identity, kept])
    squares = _sum_over(b, x, dim, True, "squares")

    def scale(b: Body, args: list[str]) -> str:
        var = payload(b, "add", [mean(b, args[1]), constant(b, eps, dtype, "eps")], dtype, "")
        y = payload(b, "div", [args[0], payload(b, "sqrt", [var], dtype, "")], dtype, "")
        if len(args) > 2:
            y = payload(b, "mul", [y, args[2]], dtype, "")
        if len(args) > 3:
            y = payload(b, "add", [y, args[3]], dtype, "")
        return y
    maps = [identity, kept] + [_loops(rank, dim)] * len(params)
    return [_elementwise(b, [x, squares, *params], x.spec, scale, ctx.op.outputs[0], maps)]


def _attention(b: Body, ctx: LoweringContext) -> list[Operand]:
    """scores = q k^T (generic), scaled and causally masked (generic), linalg.softmax over the
    keys, then weights v (generic). Loops of the op: b0 h1 s2 e3 t4 d5. With the key loop split
    (`ctx.all_reduce` given), the block's online-softmax state combined over the key axes
    (`_combined_attention`)."""
    logits, v = attention_logits(b, ctx), ctx.inputs[2]
    if ctx.all_reduce is not None:
        return [_combined_attention(b, ctx, logits, v, ctx.all_reduce)]
    weights = Operand(b.name("weights"), logits.spec)
    out = empty(b, logits.spec)
    b.emit(f"{weights.name} = linalg.softmax dimension(3) {ins_outs([logits], [out])} -> {out.type}")
    return [generic(b, [_loops(5, 0, 1, 2, 4), _loops(5, 0, 1, 4, 3), _loops(5, 0, 1, 2, 3)],
                    ["parallel"] * 4 + ["reduction"], [weights, v], reduction_init(b, ctx.out, "sum"), _dot(v.dtype),
                    hint=ctx.op.outputs[0])]


def _dot(dtype: str) -> Callable[[Body, list[str], str], str]:
    return lambda b, args, acc: payload(b, "add", [acc, payload(b, "mul", args, dtype, "")], dtype, "")


def attention_logits(b: Body, ctx: LoweringContext) -> Operand:
    """The block's scores [B, H, S, T]: q k^T * scale, the mask applied, -inf where the causal
    mask drops a pair (at the global positions `ctx.offset` gives the query and key blocks)."""
    q, k = ctx.inputs[:2]
    mask = ctx.inputs[3] if len(ctx.inputs) == 4 else None
    dtype = q.dtype
    scale = ctx.op.attrs.get("scale", 1.0 / math.sqrt(ctx.op.nest.extents[5]))
    causal = bool(ctx.op.attrs.get("causal", False))
    # outside the region: they are top-level values
    query_offset = ctx.offset(QUERY_LOOP) if causal else None
    key_offset = ctx.offset(KEY_LOOP) if causal else None
    balanced = ctx.op.attrs.get(BALANCED)  # positions of the stored indices (`ops.nn.layout_order`)
    scores_spec = Spec(q.shape[:3] + (k.shape[2],), dtype, q.sizes[:3] + (k.sizes[2],))
    contraction = ["parallel"] * 4 + ["reduction"]
    scores = generic(b, [_loops(5, 0, 1, 2, 4), _loops(5, 0, 1, 3, 4), _loops(5, 0, 1, 2, 3)], contraction, [q, k],
                     reduction_init(b, scores_spec, "sum"), _dot(dtype), hint="scores")

    def scaled(b: Body, args: list[str]) -> str:
        value = payload(b, "mul", [args[0], constant(b, scale, dtype, "scale")], dtype, "")
        if mask is not None:
            value = _apply_mask(b, value, args[1], mask.dtype, dtype)
        if not causal:
            return value
        query = layout_position(b, linalg_index(b, 2, query_offset), ctx.op.nest.extents[QUERY_LOOP], balanced)
        key = layout_position(b, linalg_index(b, 3, key_offset), ctx.op.nest.extents[KEY_LOOP], balanced)
        seen = b.name("seen")
        b.emit(f"{seen} = arith.cmpi ule, {key}, {query} : index")
        return _keep_or_ninf(b, seen, value, dtype)
    identity = AffineMap.identity(4)
    masks = [] if mask is None else [_scores_map(ctx.op.nest.maps[3])]
    return _elementwise(b, [scores] + ([mask] if mask is not None else []), scores_spec, scaled, "logits",
                        maps=[identity] + masks)


def finite_shift(b: Body, m: str, dtype: str) -> str:
    """A row maximum to take exponents against: -inf (a row all masked so far) as 0."""
    ninf = constant(b, float("-inf"), dtype, "ninf")
    masked = b.name("masked")
    b.emit(f"{masked} = arith.cmpf oeq, {m}, {ninf} : {elem_type(dtype)}")
    kept = b.name("shift")
    b.emit(f"{kept} = arith.select {masked}, {constant(b, 0.0, dtype, 'zero')}, {m} : {elem_type(dtype)}")
    return kept


def exp_against(b: Body, value: str, row_max: str, dtype: str) -> str:
    """exp(value - row_max), a row maximum of -inf taken as 0."""
    return payload(b, "exp", [payload(b, "sub", [value, finite_shift(b, row_max, dtype)], dtype, "")], dtype, "")


def attention_block_state(b: Body, ctx: LoweringContext, logits: Operand,
                          v: Operand) -> tuple[Operand, Operand, Operand]:
    """The key block's row maximum m [B, H, S], exponent sums l and weighted values o
    [B, H, S, E], both against m (as `ops.nn.attention_block_state`). A row all masked in this
    block has m = -inf: it exponentiates against 0."""
    dtype = logits.dtype
    rows_spec = logits.spec.take((0, 1, 2))
    rows, scores_rows = _loops(4, 0, 1, 2), AffineMap.identity(4)
    reduce_keys = ["parallel"] * 3 + ["reduction"]

    def fold(kind: str) -> Callable[[Body, list[str], str], str]:
        return lambda b, args, acc: combine(b, kind, acc, args[0], dtype, ctx.where)
    row_max = generic(b, [scores_rows, rows], reduce_keys, [logits], reduction_init(b, rows_spec, "max"), fold("max"),
                      hint="row_max")
    weights = _elementwise(b, [logits, row_max], logits.spec, lambda b, a: exp_against(b, a[0], a[1], dtype),
                           "block_weights", maps=[scores_rows, rows])
    exp_sum = generic(b, [scores_rows, rows], reduce_keys, [weights], reduction_init(b, rows_spec, "sum"), fold("sum"),
                      hint="exp_sum")
    weighted = generic(b, [_loops(5, 0, 1, 2, 4), _loops(5, 0, 1, 4, 3), _loops(5, 0, 1, 2, 3)],
                       ["parallel"] * 4 + ["reduction"], [weights, v], reduction_init(b, ctx.out, "sum"), _dot(dtype),
                       hint="weighted")
    return row_max, exp_sum, weighted


def rescaled(b: Body, ctx: LoweringContext, row_max: Operand, exp_sum: Operand, weighted: Operand,
             new_max: Operand) -> tuple[Operand, Operand]:
    """A block's exponent sums and weighted values against a larger row maximum: times
    exp(m - M) (0 for a block whose row is all masked: exp(-inf - M))."""
    dtype, rows_spec = row_max.dtype, row_max.spec
    factors = _elementwise(b, [row_max, new_max], rows_spec, lambda b, a: exp_against(b, a[0], a[1], dtype), "rescale")
    identity3, out_rows = AffineMap.identity(3), _loops(4, 0, 1, 2)
    scaled_sum = _elementwise(b, [exp_sum, factors], rows_spec,
                              lambda b, a: payload(b, "mul", a, dtype, ""), "scaled_sum", maps=[identity3, identity3])
    scaled = _elementwise(b, [weighted, factors], ctx.out, lambda b, a: payload(b, "mul", a, dtype, ""),
                          "scaled_weighted", maps=[AffineMap.identity(4), out_rows])
    return scaled_sum, scaled


def divided(b: Body, ctx: LoweringContext, total: Operand, total_sum: Operand) -> Operand:
    """The attention result: the weighted values over the exponent sums."""
    return _elementwise(b, [total, total_sum], ctx.out, lambda b, a: payload(b, "div", a, total.dtype, ""),
                        ctx.op.outputs[0], maps=[AffineMap.identity(4), _loops(4, 0, 1, 2)])


def _combined_attention(b: Body, ctx: LoweringContext, logits: Operand, v: Operand,
                        all_reduce: Callable[[Body, Operand, str, str], Operand]) -> Operand:
    """The key block's state (`attention_block_state`); then all_reduce max of m to M, l and o
    rescaled by exp(m - M), all_reduce sum of both, o / l (as `sim.attention`)."""
    row_max, exp_sum, weighted = attention_block_state(b, ctx, logits, v)
    global_max = all_reduce(b, row_max, "max", "global_max")
    scaled_sum, scaled = rescaled(b, ctx, row_max, exp_sum, weighted, global_max)
    total_sum = all_reduce(b, scaled_sum, "sum", "total_sum")
    total = all_reduce(b, scaled, "sum", "total")
    return divided(b, ctx, total, total_sum)


def _keep_or_ninf(b: Body, keep: str, value: str, dtype: str) -> str:
    masked = b.name("masked")
    b.emit(f"{masked} = arith.select {keep}, {value}, {constant(b, float('-inf'), dtype, 'ninf')} : {elem_type(dtype)}")
    return masked


def _apply_mask(b: Body, value: str, mask: str, mask_dtype: str, dtype: str) -> str:
    """As the op table's attention: a bool mask keeps the scores where true, any other is added."""
    if mask_dtype == "bool":
        return _keep_or_ninf(b, mask, value, dtype)
    return payload(b, "add", [value, convert(b, mask, mask_dtype, dtype)], dtype, "")


def _scores_map(mask_map: AffineMap) -> AffineMap:
    """The attention mask's map over the op's loops b0 h1 s2 e3 t4 d5, as a map over the scores'
    loops b h s t."""
    position = {0: 0, 1: 1, 2: 2, 4: 3}
    return AffineMap(4, tuple(AffineExpr.loop(position[e.loops[0]]) if e.loops else e for e in mask_map.results))


def _zero_pad(b: Body, x: Operand, low: Sequence[int], high: Sequence[int], hint: str) -> Operand:
    """`x` with zeros added before (`low`) and after (`high`) each dim; padded dims are static."""
    return pad_cells(b, x, low, high, constant(b, 0, x.dtype, "zero"), hint)


def _embedding(b: Body, ctx: LoweringContext) -> list[Operand]:
    """out[..., d] = sum over v of (ids[...] == v ? table[v, d] : 0): the op's own loop nest, so a
    vocabulary split gives partial sums."""
    ids, table = ctx.inputs
    v_loop = len(ctx.op.nest.extents) - 1
    dtype = ctx.out.dtype
    vocab_offset = ctx.offset(v_loop)  # outside the region: it is a top-level value
    init = reduction_init(b, ctx.out, "sum")

    def region(b: Body, args: list[str], acc: str) -> str:
        row = b.name("row")
        b.emit(f"{row} = arith.index_cast {args[0]} : {elem_type(ids.dtype)} to index")
        vocab = linalg_index(b, v_loop, vocab_offset)
        hit = b.name("hit")
        b.emit(f"{hit} = arith.cmpi eq, {row}, {vocab} : index")
        picked = b.name("picked")
        b.emit(f"{picked} = arith.select {hit}, {args[1]}, {constant(b, 0, dtype, 'zero')} : {elem_type(dtype)}")
        return combine(b, "sum", acc, picked, dtype, ctx.where)
    return [generic(b, ctx.op.nest.maps, _linalg_iterators(ctx.op), [ids, table], init, region, hint=ctx.op.outputs[0])]


# --- data movement ------------------------------------------------------------------------

def _transpose(b: Body, ctx: LoweringContext) -> list[Operand]:
    (x,) = ctx.inputs
    perm = ctx.op.attrs.get("perm", list(reversed(range(len(x.shape)))))
    out = empty(b, ctx.out)
    result = b.name(ctx.op.outputs[0])
    b.emit(f"{result} = linalg.transpose {ins_outs([x], [out])} permutation = {int_list(perm)}")
    return [Operand(result, out.spec)]


def _groups(big: Sequence[int], small: Sequence[int]) -> list[list[int]] | None:
    """Reassociation of `small`'s dims onto runs of `big`'s dims with equal products (unit dims
    of `big` join a neighbouring run), or None when `big` is not a refinement of `small`."""
    if not small:
        return [] if all(s == 1 for s in big) else None
    groups: list[list[int]] = [[] for _ in small]
    j, acc = 0, 1
    for i, size in enumerate(big):
        if j == len(small):
            if size != 1:
                return None
            groups[-1].append(i)
            continue
        groups[j].append(i)
        acc *= size
        if acc == small[j] and (i + 1 == len(big) or big[i + 1] != 1 or j + 1 == len(small)):
            j, acc = j + 1, 1
        elif acc > small[j]:
            return None
    return groups if j == len(small) else None


def _reassociation(src: tuple[int, ...], dst: tuple[int, ...]) -> tuple[str, list[list[int]]] | None:
    """The one tensor.expand_shape or tensor.collapse_shape taking `src` to `dst`, if one does."""
    if len(dst) >= len(src):
        groups = _groups(dst, src)
        if groups is not None:
            return "expand_shape", groups
    if len(dst) <= len(src):
        groups = _groups(src, dst)
        if groups is not None:
            return "collapse_shape", groups
    return None


def _reshape_to(b: Body, x: Operand, out: Spec, hint: str) -> Operand:
    kind, groups = _reassociation(x.shape, out.shape) or ("", [])
    assert kind, f"no single reassociation from {x.shape} to {out.shape}"
    result = Operand(b.name(hint), out)
    nested = "[" + ", ".join(int_list(g) for g in groups) + "]"
    suffix = f" output_shape [{', '.join(str(d) for d in out.sizes)}]" if kind == "expand_shape" else ""
    b.emit(f"{result.name} = tensor.{kind} {x.name} {nested}{suffix} : {x.type} into {result.type}")
    return result


def _reshape(b: Body, ctx: LoweringContext) -> list[Operand]:
    """One expand or collapse when the reshape is one; else collapse to 1-D and expand (a
    row-major reshape, which is also the local reshape of every contiguous block)."""
    (x,) = ctx.inputs
    if x.shape == ctx.out.shape:
        return [x]
    if _reassociation(x.shape, ctx.out.shape) is None:
        dynamic = any(isinstance(d, str) for d in x.sizes)
        x = _reshape_to(b, x, Spec((math.prod(x.shape),), x.dtype, ("?",) if dynamic else None), "flat")
    return [_reshape_to(b, x, ctx.out, ctx.op.outputs[0])]


def _concat(b: Body, ctx: LoweringContext) -> list[Operand]:
    dim = ctx.op.attrs.get("axis", 0) % len(ctx.out.shape)
    result = Operand(b.name(ctx.op.outputs[0]), ctx.out)
    b.emit(f"{result.name} = tensor.concat dim({dim}) {', '.join(o.name for o in ctx.inputs)} : "
           f"({', '.join(o.type for o in ctx.inputs)}) -> {result.type}")
    return [result]


def _slice(b: Body, ctx: LoweringContext) -> list[Operand]:
    (x,) = ctx.inputs
    rank = len(x.shape)
    starts = ctx.op.attrs.get("starts", [0] * rank)
    strides = ctx.op.attrs.get("strides", [1] * rank)
    result = Operand(b.name(ctx.op.outputs[0]), ctx.out)
    b.emit(f"{result.name} = tensor.extract_slice {x.name}{int_list(starts)} [{', '.join(str(d) for d in ctx.out.sizes)}] "
           f"{int_list(strides)} : {x.type} to {result.type}")
    return [result]


def _pad(b: Body, ctx: LoweringContext) -> list[Operand]:
    rank = len(ctx.inputs[0].shape)
    return [_zero_pad(b, ctx.inputs[0], ctx.op.attrs.get("low", [0] * rank), ctx.op.attrs.get("high", [0] * rank),
                      ctx.op.outputs[0])]


def _iota(b: Body, ctx: LoweringContext) -> list[Operand]:
    """Each element is its global index along `dimension`: the block's offset plus the local index."""
    out = ctx.out
    dim = normalize_dim(ctx.op.attrs.get("dimension", 0), len(out.shape), "dimension")
    offset = ctx.offset(dim)  # outside the region: it is a top-level value

    def region(b: Body, args: list[str], acc: str) -> str:
        index = b.name("index")
        b.emit(f"{index} = arith.index_cast {linalg_index(b, dim, offset)} : index to i64")
        return convert(b, index, "i64", out.dtype)
    return [generic(b, [AffineMap.identity(len(out.shape))], ["parallel"] * len(out.shape), [], empty(b, out), region,
                    hint=ctx.op.outputs[0])]


# Predicates per comparison direction: ordered float comparisons except `ne` (numpy: nan != x);
# signed integers; bool compares as 0 < 1.
_PREDICATES = {"eq": ("oeq", "eq", "eq"), "ne": ("une", "ne", "ne"), "lt": ("olt", "slt", "ult"),
               "le": ("ole", "sle", "ule"), "gt": ("ogt", "sgt", "ugt"), "ge": ("oge", "sge", "uge")}


def _compare(b: Body, ctx: LoweringContext) -> list[Operand]:
    dtype = ctx.inputs[0].dtype
    float_predicate, int_predicate, bool_predicate = _PREDICATES[ctx.op.attrs["direction"]]

    def region(b: Body, args: list[str], acc: str) -> str:
        values = [convert(b, a, o.dtype, dtype) for a, o in zip(args, ctx.inputs)]
        result = b.name("cmp")
        if DTYPES[dtype].is_float:
            b.emit(f"{result} = arith.cmpf {float_predicate}, {values[0]}, {values[1]} : {elem_type(dtype)}")
        else:
            predicate = bool_predicate if dtype == "bool" else int_predicate
            b.emit(f"{result} = arith.cmpi {predicate}, {values[0]}, {values[1]} : {elem_type(dtype)}")
        return result
    return [generic(b, ctx.op.nest.maps, _linalg_iterators(ctx.op), ctx.inputs, empty(b, ctx.out), region,
                    hint=ctx.op.outputs[0])]


def _select(b: Body, ctx: LoweringContext) -> list[Operand]:
    """A bool selector picks the second case where true; an integer one picks the case it numbers."""
    which, cases = ctx.inputs[0], ctx.inputs[1:]
    dtype = ctx.out.dtype

    def region(b: Body, args: list[str], acc: str) -> str:
        values = [convert(b, a, o.dtype, dtype) for a, o in zip(args[1:], cases)]
        picked = values[0]
        for number, value in enumerate(values[1:], start=1):
            if which.dtype == "bool":
                hit = args[0]
            else:
                hit = b.name("hit")
                b.emit(f"{hit} = arith.cmpi eq, {args[0]}, {constant(b, number, which.dtype, 'case')} : "
                       f"{elem_type(which.dtype)}")
            chosen = b.name("picked")
            b.emit(f"{chosen} = arith.select {hit}, {value}, {picked} : {elem_type(dtype)}")
            picked = chosen
        return picked
    return [generic(b, ctx.op.nest.maps, _linalg_iterators(ctx.op), ctx.inputs, empty(b, ctx.out), region,
                    hint=ctx.op.outputs[0])]


def _opaque(b: Body, ctx: LoweringContext) -> list[Operand]:
    primitive = ctx.op.attrs.get("primitive", "unnamed")
    raise InputError(f"op {ctx.op.name!r} is opaque (framework primitive {primitive!r}): its meaning is unknown, "
                     "so it has no MLIR lowering", ctx.where)


LOWERINGS: dict[str, Lowering] = {
    "matmul": _named_contraction("linalg.matmul", 2),
    "batch_matmul": _named_contraction("linalg.batch_matmul", 3),
    "reduce_mean": _reduce_mean,
    "softmax": _softmax,
    "layer_norm": lambda b, ctx: _normalise(b, ctx, True),
    "rms_norm": lambda b, ctx: _normalise(b, ctx, False),
    "attention": _attention,
    "conv1d": lower_conv, "conv2d": lower_conv, "conv3d": lower_conv,
    "max_pool2d": lower_pool, "avg_pool2d": lower_pool,
    "embedding": _embedding,
    "transpose": _transpose,
    "reshape": _reshape,
    "broadcast_in_dim": lambda b, ctx: _payload_nest(b, ctx, "copy"),
    "concat": _concat,
    "slice": _slice,
    "pad": _pad,
    "iota": _iota,
    "compare": _compare,
    "select": _select,
    "opaque": _opaque,
    "one_hot": one_hot,
    "top_k_values": top_k,
    "top_k_indices": top_k,
    "cumulative": cumulative,
    "scatter_add": scatter,
    "scatter": scatter,
    "grad": lower_grad,
}


def lower(b: Body, ctx: LoweringContext) -> list[Operand]:
    """Emit `ctx.op` and return its results; kinds not in the table are payload loop nests."""
    if ctx.op.op_kind.float_only:
        ctx.require_float()
    return LOWERINGS.get(ctx.op.kind, _payload_nest)(b, ctx)
