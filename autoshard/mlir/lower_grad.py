"""`grad` ops as MLIR: one lowering per forward kind, computing what `autoshard.ops.grads` computes.

Inputs are the forward op's inputs, then the output gradient `dy`; the result is the gradient
of input `wrt`. Loops of the forward op that do not index that input are summed over, so on a
block of them the result is a partial sum, as the op table's block semantics say.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

from autoshard.affine import AffineMap
from autoshard.errors import InputError
from autoshard.mlir.lower_window import conv_filter_grad, pool_grad
from autoshard.mlir.linalg import (Operand, Spec, empty, generic, ins_outs, layout_position, linalg_index,
                                   reduction_init)
from autoshard.mlir.lower_selection import top_k_values_grad
from autoshard.mlir.scalar import combine, constant, payload
from autoshard.mlir.text import Body, elem_type
from autoshard.ops.loops import REDUCTION
from autoshard.ops.nn import BALANCED

if TYPE_CHECKING:
    from autoshard.mlir.lower import LoweringContext


class Arith:
    """Scalar arithmetic in one dtype, for the formulas below."""

    def __init__(self, b: Body, dtype: str):
        self.b, self.dtype = b, dtype

    def op(self, name: str, *args: str) -> str:
        return payload(self.b, name, list(args), self.dtype, "")

    def const(self, value: float) -> str:
        return constant(self.b, value, self.dtype)

    def mul(self, *args: str) -> str:
        value = args[0]
        for a in args[1:]:
            value = self.op("mul", value, a)
        return value


def _sign(a: Arith, x: str) -> str:
    """numpy's sign: 1, -1, or 0 at 0."""
    zero = a.const(0.0)
    positive, negative = a.b.name("pos"), a.b.name("negative")
    a.b.emit(f"{positive} = arith.cmpf ogt, {x}, {zero} : {elem_type(a.dtype)}")
    a.b.emit(f"{negative} = arith.cmpf olt, {x}, {zero} : {elem_type(a.dtype)}")
    inner, outer = a.b.name("sign"), a.b.name("sign")
    a.b.emit(f"{inner} = arith.select {negative}, {a.const(-1.0)}, {zero} : {elem_type(a.dtype)}")
    a.b.emit(f"{outer} = arith.select {positive}, {a.const(1.0)}, {inner} : {elem_type(a.dtype)}")
    return outer


def _sigmoid(a: Arith, x: str) -> str:
    return a.op("sigmoid", x)


def _gelu_slope(a: Arith, x: str) -> str:
    c, k = a.const(0.7978845608028654), a.const(0.044715)
    x2 = a.mul(x, x)
    t = a.op("tanh", a.mul(c, a.op("add", x, a.mul(k, x2, x))))
    half, one = a.const(0.5), a.const(1.0)
    left = a.mul(half, a.op("add", one, t))
    right = a.mul(half, x, a.op("sub", one, a.mul(t, t)), c, a.op("add", one, a.mul(a.const(3.0), k, x2)))
    return a.op("add", left, right)


def _gelu_erf_slope(a: Arith, x: str) -> str:
    phi = a.mul(a.const(0.3989422804014327), a.op("exp", a.mul(a.const(-0.5), x, x)))
    cdf = a.mul(a.const(0.5), a.op("add", a.const(1.0), a.op("erf", a.mul(a.const(0.7071067811865476), x))))
    return a.op("add", cdf, a.mul(x, phi))


# d f(x) / dx for the elementwise kinds with a gradient rule, as in autoshard.ops.grads.SLOPES.
SLOPES: dict[str, Callable[[Arith, str], str]] = {
    "neg": lambda a, x: a.const(-1.0),
    "abs": _sign,
    "exp": lambda a, x: a.op("exp", x),
    "log": lambda a, x: a.op("div", a.const(1.0), x),
    "sqrt": lambda a, x: a.op("div", a.const(0.5), a.op("sqrt", x)),
    "rsqrt": lambda a, x: a.op("div", a.mul(a.const(-0.5), a.op("rsqrt", x)), x),
    "tanh": lambda a, x: a.op("sub", a.const(1.0), a.op("square", a.op("tanh", x))),
    "sin": lambda a, x: a.op("cos", x),
    "cos": lambda a, x: a.op("neg", a.op("sin", x)),
    "relu": lambda a, x: _step(a, x),
    "gelu": _gelu_slope,
    "erf": lambda a, x: a.mul(a.const(1.1283791670955126), a.op("exp", a.mul(a.const(-1.0), x, x))),
    "gelu_erf": _gelu_erf_slope,
    "sigmoid": lambda a, x: a.mul(_sigmoid(a, x), a.op("sub", a.const(1.0), _sigmoid(a, x))),
    "silu": lambda a, x: _silu_slope(a, x),
    "square": lambda a, x: a.mul(a.const(2.0), x),
}


def _step(a: Arith, x: str) -> str:
    """1 where x > 0, else 0 (relu's slope)."""
    positive, value = a.b.name("pos"), a.b.name("step")
    a.b.emit(f"{positive} = arith.cmpf ogt, {x}, {a.const(0.0)} : {elem_type(a.dtype)}")
    a.b.emit(f"{value} = arith.select {positive}, {a.const(1.0)}, {a.const(0.0)} : {elem_type(a.dtype)}")
    return value


def _silu_slope(a: Arith, x: str) -> str:
    s = _sigmoid(a, x)
    return a.mul(s, a.op("add", a.const(1.0), a.mul(x, a.op("sub", a.const(1.0), s))))


# --- the lowerings ------------------------------------------------------------------------

def _loops(n: int, *loops: int) -> AffineMap:
    return AffineMap.from_callable(n, lambda *d: [d[l] for l in loops])


def parallel_nest(b: Body, inputs: list[Operand], maps: list[AffineMap], out: Spec, fn: Callable[[Arith, list[str]], str],
              hint: str) -> Operand:
    """A parallel generic writing `out` (identity output map), scalar body `fn`."""
    rank = len(out.shape)
    return generic(b, maps + [AffineMap.identity(rank)], ["parallel"] * rank, inputs, empty(b, out),
                   lambda b, args, acc: fn(Arith(b, out.dtype), args), hint=hint)


def summed(b: Body, inputs: list[Operand], maps: list[AffineMap], iterators: list[str], out: Spec,
            fn: Callable[[Arith, list[str]], str], hint: str) -> Operand:
    """A generic summing `fn` of its inputs over the reduction loops into `out` (last map)."""
    return generic(b, maps, iterators, inputs, reduction_init(b, out, "sum"),
                   lambda b, args, acc: Arith(b, out.dtype).op("add", acc, fn(Arith(b, out.dtype), args)), hint=hint)


def _elementwise_grad(b: Body, ctx: LoweringContext, of: str, wrt: int) -> list[Operand]:
    x, dy = ctx.inputs[0], ctx.inputs[-1]
    nest = ctx.op.nest
    return [generic(b, [nest.input_maps[0], nest.input_maps[-1], nest.output_maps[0]], ["parallel"] * nest.num_loops,
                    [x, dy], empty(b, ctx.out), lambda b, args, acc: Arith(b, x.dtype).mul(
                        args[1], SLOPES[of](Arith(b, x.dtype), args[0])), hint=ctx.op.outputs[0])]


def _pow_grad(b: Body, ctx: LoweringContext, of: str, wrt: int) -> list[Operand]:
    """dy * p * x^(p - 1), summed over the loops a broadcast base does not index."""
    x, p, dy = ctx.inputs
    nest = ctx.op.nest
    iterators = ["reduction" if t == REDUCTION else "parallel" for t in nest.iterator_types]
    maps = [nest.input_maps[0], nest.input_maps[1], nest.input_maps[-1], nest.output_maps[0]]
    return [summed(b, [x, p, dy], maps, iterators, ctx.out,
                    lambda a, v: a.mul(v[2], v[1], a.op("pow", v[0], a.op("sub", v[1], a.const(1.0)))),
                    hint=ctx.op.outputs[0])]


def _reduce_mean_grad(b: Body, ctx: LoweringContext, of: str, wrt: int) -> list[Operand]:
    dy, nest = ctx.inputs[-1], ctx.op.nest
    kept = {loop for expr in nest.input_maps[-1].results for loop in expr.loops}
    count = math.prod(e for loop, e in enumerate(nest.extents) if loop not in kept)  # global, as the forward op
    return [generic(b, [nest.input_maps[-1], nest.output_maps[0]], ["parallel"] * nest.num_loops, [dy], empty(b, ctx.out),
                    lambda b, args, acc: Arith(b, dy.dtype).op("div", args[0], constant(b, count, dy.dtype, "count")),
                    hint=ctx.op.outputs[0])]


def _norm_grad(centred: bool) -> Callable:
    def lower(b: Body, ctx: LoweringContext, of: str, wrt: int) -> list[Operand]:
        forward = ctx.op.attrs.get("forward", {})
        x, dy = ctx.inputs[0], ctx.inputs[-1]
        gamma = ctx.inputs[1] if len(ctx.inputs) > 2 else None
        rank = len(x.shape)
        dim = forward.get("axis", -1) % rank
        n = ctx.extents[dim]  # the normalised dim is never split
        eps = forward.get("eps", 1e-5 if centred else 1e-6)
        identity, row = AffineMap.identity(rank), _loops(rank, *[d for d in range(rank) if d != dim])
        rows = x.spec.take([d for d in range(rank) if d != dim])
        over_dim = ["reduction" if d == dim else "parallel" for d in range(rank)]
        if centred:
            total = summed(b, [x], [identity, row], over_dim, rows, lambda a, v: v[0], "sum")
            x = parallel_nest(b, [x, total], [identity, row], x.spec,
                          lambda a, v: a.op("sub", v[0], a.op("div", v[1], a.const(n))), "centred")
        squares = summed(b, [x], [identity, row], over_dim, rows, lambda a, v: a.op("square", v[0]), "squares")
        inv_std = parallel_nest(b, [squares], [AffineMap.identity(rank - 1)], rows, lambda a, v: a.op(
            "div", a.const(1.0), a.op("sqrt", a.op("add", a.op("div", v[0], a.const(n)), a.const(eps)))), "inv_std")
        x_hat = parallel_nest(b, [x, inv_std], [identity, row], x.spec, lambda a, v: a.mul(v[0], v[1]), "x_hat")
        if wrt in (1, 2):
            over_rows = ["parallel" if d == dim else "reduction" for d in range(rank)]
            out_map = _loops(rank, dim)
            if wrt == 2:
                return [summed(b, [dy], [identity, out_map], over_rows, ctx.out, lambda a, v: v[0], ctx.op.outputs[0])]
            return [summed(b, [dy, x_hat], [identity, identity, out_map], over_rows, ctx.out, lambda a, v: a.mul(*v),
                            ctx.op.outputs[0])]
        g = dy if gamma is None else parallel_nest(b, [dy, gamma], [identity, _loops(rank, dim)], dy.spec,
                                               lambda a, v: a.mul(*v), "g")
        g_sum = summed(b, [g], [identity, row], over_dim, rows, lambda a, v: v[0], "g_sum") if centred else None
        gx_sum = summed(b, [g, x_hat], [identity, identity, row], over_dim, rows, lambda a, v: a.mul(*v), "gx_sum")

        def dx(a: Arith, v: list[str]) -> str:
            g_, x_hat_, inv, *sums = v
            centred_g = a.op("sub", g_, a.op("div", sums[0], a.const(n))) if centred else g_
            return a.mul(inv, a.op("sub", centred_g, a.mul(x_hat_, a.op("div", sums[-1], a.const(n)))))
        inputs = [g, x_hat, inv_std] + ([g_sum] if centred else []) + [gx_sum]
        maps = [identity, identity, row] + ([row] if centred else []) + [row]
        return [parallel_nest(b, inputs, maps, ctx.out, dx, ctx.op.outputs[0])]
    return lower


def _attention_grad(b: Body, ctx: LoweringContext, of: str, wrt: int) -> list[Operand]:
    """Recompute the weights p = softmax(mask(q k^T * scale)); then dv = p^T dy, or with
    dp = dy v^T and ds = p (dp - rowsum(p dp)) scale: dq = ds k, dk = ds^T q. With the key loop
    split (`ctx.all_reduce` given) the softmax's row statistics span every device's keys: the
    row maximum and the exponent sums, and rowsum(p dp), each all-reduced (max, sum, sum)."""
    if len(ctx.inputs) != 4:
        raise InputError(f"op {ctx.op.name!r} (gradient of attention with a mask input) is not lowered to MLIR yet", ctx.where)
    q, k, v, dy = ctx.inputs
    logits = attention_grad_logits(b, ctx)
    scores = logits.spec
    if ctx.all_reduce is None:
        p = Operand(b.name("weights"), scores)
        out = empty(b, scores)
        b.emit(f"{p.name} = linalg.softmax dimension(3) {ins_outs([logits], [out])} -> {out.type}")
    else:
        p = _key_split_weights(b, logits, ctx.all_reduce)
    if wrt == 2:
        return [attention_grad_block(b, ctx, wrt, p, None, None)]
    dp = attention_grad_dp(b, dy, v, scores)
    rowdot = summed(b, [p, dp], [AffineMap.identity(4)] * 2 + [_loops(4, 0, 1, 2)], ["parallel"] * 3 + ["reduction"],
                     scores.take([0, 1, 2]), lambda a, args: a.mul(*args), "rowdot")
    if ctx.all_reduce is not None:
        rowdot = ctx.all_reduce(b, rowdot, "sum", "total_rowdot")
    return [attention_grad_block(b, ctx, wrt, p, dp, rowdot)]


def attention_grad_logits(b: Body, ctx: LoweringContext) -> Operand:
    """A gradient of attention's scores of its q and k blocks (`ctx.inputs[:2]`): q k^T * scale,
    -inf where the causal mask drops a pair (at the global positions `ctx.offset` gives)."""
    forward = ctx.op.attrs.get("forward", {})
    q, k = ctx.inputs[:2]
    dtype = q.dtype
    scale = forward.get("scale", 1.0 / math.sqrt(ctx.op.nest.extents[5]))
    causal = bool(forward.get("causal", False))
    # outside the regions: they are top-level values
    query_offset, key_offset = (ctx.offset(2), ctx.offset(4)) if causal else (None, None)
    balanced = forward.get(BALANCED)  # positions of the stored indices (`ops.nn.layout_order`)
    scores = Spec(q.shape[:3] + (k.shape[2],), dtype, q.sizes[:3] + (k.sizes[2],))
    contract = ["parallel"] * 4 + ["reduction"]
    logits = summed(b, [q, k], [_loops(5, 0, 1, 2, 4), _loops(5, 0, 1, 3, 4), _loops(5, 0, 1, 2, 3)], contract, scores,
                     lambda a, args: a.mul(*args), "scores")

    def masked(a: Arith, args: list[str]) -> str:
        value = a.mul(args[0], a.const(scale))
        if not causal:
            return value
        query = layout_position(a.b, linalg_index(a.b, 2, query_offset), ctx.op.nest.extents[2], balanced)
        key = layout_position(a.b, linalg_index(a.b, 3, key_offset), ctx.op.nest.extents[4], balanced)
        seen, out = a.b.name("seen"), a.b.name("masked")
        a.b.emit(f"{seen} = arith.cmpi ule, {key}, {query} : index")
        a.b.emit(f"{out} = arith.select {seen}, {value}, {a.const(float('-inf'))} : {elem_type(dtype)}")
        return out
    return parallel_nest(b, [logits], [AffineMap.identity(4)], scores, masked, "logits")


def attention_grad_dp(b: Body, dy: Operand, v: Operand, scores: Spec) -> Operand:
    """dp = dy v^T over the block's keys."""
    return summed(b, [dy, v], [_loops(5, 0, 1, 2, 4), _loops(5, 0, 1, 3, 4), _loops(5, 0, 1, 2, 3)],
                   ["parallel"] * 4 + ["reduction"], scores, lambda a, args: a.mul(*args), "dp")


def attention_grad_block(b: Body, ctx: LoweringContext, wrt: int, p: Operand, dp: Operand | None,
                         rowdot: Operand | None) -> Operand:
    """The gradient of the op's block from the weights p over its keys, dp and rowsum(p dp) over
    every key: dv = p^T dy, or with ds = p (dp - rowdot) scale, dq = ds k, dk = ds^T q."""
    q, k, _, dy = ctx.inputs
    contract, name = ["parallel"] * 4 + ["reduction"], ctx.op.outputs[0]
    dot = lambda a, args: a.mul(*args)  # noqa: E731
    if wrt == 2:
        return summed(b, [p, dy], [_loops(5, 0, 1, 4, 2), _loops(5, 0, 1, 4, 3), _loops(5, 0, 1, 2, 3)], contract,
                       ctx.out, dot, name)
    scale = ctx.op.attrs.get("forward", {}).get("scale", 1.0 / math.sqrt(ctx.op.nest.extents[5]))
    identity, rows = AffineMap.identity(4), _loops(4, 0, 1, 2)
    ds = parallel_nest(b, [p, dp, rowdot], [identity] * 2 + [rows], p.spec,
                   lambda a, v: a.mul(v[0], a.op("sub", v[1], v[2]), a.const(scale)), "ds")
    if wrt == 0:
        return summed(b, [ds, k], [_loops(5, 0, 1, 2, 4), _loops(5, 0, 1, 4, 3), _loops(5, 0, 1, 2, 3)], contract,
                       ctx.out, dot, name)
    return summed(b, [ds, q], [_loops(5, 0, 1, 4, 2), _loops(5, 0, 1, 4, 3), _loops(5, 0, 1, 2, 3)], contract,
                   ctx.out, dot, name)


def _key_split_weights(b: Body, logits: Operand, all_reduce: Callable[[Body, Operand, str, str], Operand]) -> Operand:
    """softmax over every device's keys of this block's logits: exp(logits - M) / l with M the
    all-reduced row maximum and l the all-reduced exponent sums (a row all masked everywhere has
    M = -inf and stays 0 / 0, as the unsplit softmax)."""
    dtype = logits.dtype
    row_spec = logits.spec.take([0, 1, 2])
    identity, rows = AffineMap.identity(4), _loops(4, 0, 1, 2)
    reduce_keys = ["parallel"] * 3 + ["reduction"]
    local_max = generic(b, [identity, rows], reduce_keys, [logits], reduction_init(b, row_spec, "max"),
                        lambda b, args, acc: combine(b, "max", acc, args[0], dtype, ""), hint="row_max")
    row_max = all_reduce(b, local_max, "max", "global_max")

    def exponent(a: Arith, args: list[str]) -> str:
        masked, shift = a.b.name("masked"), a.b.name("shift")
        a.b.emit(f"{masked} = arith.cmpf oeq, {args[1]}, {a.const(float('-inf'))} : {elem_type(dtype)}")
        a.b.emit(f"{shift} = arith.select {masked}, {a.const(0.0)}, {args[1]} : {elem_type(dtype)}")
        return a.op("exp", a.op("sub", args[0], shift))
    weights = parallel_nest(b, [logits, row_max], [identity, rows], logits.spec, exponent, "block_weights")
    local_sum = summed(b, [weights], [identity, rows], reduce_keys, row_spec, lambda a, args: args[0], "exp_sum")
    exp_sum = all_reduce(b, local_sum, "sum", "total_sum")
    return parallel_nest(b, [weights, exp_sum], [identity, rows], logits.spec, lambda a, v: a.op("div", v[0], v[1]),
                     "weights")


def _embedding_grad(b: Body, ctx: LoweringContext, of: str, wrt: int) -> list[Operand]:
    """d table[v, d] = sum over the ids of (id == v ? dy[..., d] : 0), over the forward loops."""
    ids, dy = ctx.inputs[0], ctx.inputs[-1]
    nest = ctx.op.nest
    v_loop = nest.num_loops - 1
    vocab_offset = ctx.offset(v_loop)  # outside the region: it is a top-level value
    iterators = ["reduction" if t == REDUCTION else "parallel" for t in nest.iterator_types]

    def region(b: Body, args: list[str], acc: str) -> str:
        row, hit, picked = b.name("row"), b.name("hit"), b.name("picked")
        b.emit(f"{row} = arith.index_cast {args[0]} : {elem_type(ids.dtype)} to index")
        b.emit(f"{hit} = arith.cmpi eq, {row}, {linalg_index(b, v_loop, vocab_offset)} : index")
        b.emit(f"{picked} = arith.select {hit}, {args[1]}, {constant(b, 0, dy.dtype, 'zero')} : {elem_type(dy.dtype)}")
        return combine(b, "sum", acc, picked, dy.dtype, "")
    return [generic(b, [nest.input_maps[0], nest.input_maps[-1], nest.output_maps[0]], iterators, [ids, dy],
                    reduction_init(b, ctx.out, "sum"), region, hint=ctx.op.outputs[0])]


GRAD_LOWERINGS: dict[str, Callable[[Body, "LoweringContext", str, int], list[Operand]]] = {
    **{name: _elementwise_grad for name in SLOPES},
    "pow": _pow_grad,
    "reduce_mean": _reduce_mean_grad,
    "layer_norm": _norm_grad(True),
    "rms_norm": _norm_grad(False),
    "attention": _attention_grad,
    "embedding": _embedding_grad,
    **{f"conv{rank}d": conv_filter_grad for rank in (1, 2, 3)},
    "max_pool2d": pool_grad, "avg_pool2d": pool_grad,
    "top_k_values": top_k_values_grad,
}


def lower_grad(b: Body, ctx: LoweringContext) -> list[Operand]:
    of, wrt = ctx.op.attrs["of"], ctx.op.attrs["wrt"]
    if of != "embedding":
        ctx.require_float()
    if of not in GRAD_LOWERINGS:
        raise InputError(f"op {ctx.op.name!r}: no MLIR lowering for the gradient of {of}", ctx.where)
    return GRAD_LOWERINGS[of](b, ctx, of, wrt)
