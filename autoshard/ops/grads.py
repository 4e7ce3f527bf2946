"""`grad`: the gradient of a table op with respect to one of its operands.

Inputs: the forward op's inputs, then the gradient of its output; attributes `of` (the forward
kind), `wrt` (which input) and `forward` (the forward op's attributes). The loop nest is the
forward op's own: the forward maps read the inputs, the forward output map reads the output
gradient, and the result is written through the differentiated input's map. A loop that
indexes that input stays parallel; one that does not becomes a sum (the gradient collects a
contribution from every point of it); a forward `invalid` loop stays invalid.

The row exists for backward passes the rest of the table cannot express: derivatives that need
constants (gelu, silu, tanh, pow's p - 1, the norms' eps, a mean's 1/n), the causal mask of attention, and
the scatter-add of an embedding lookup, the scatter of a top-k selection. Contractions, reshapes and sums differentiate into
ordinary table ops and have no rule here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from autoshard.affine import AffineMap
from autoshard.ops.attributes import attribute_problems
from autoshard.ops.loops import INVALID, PARALLEL, REDUCTION, LoopNest, map_extent
from autoshard.ops.nn import KEY_LOOP, attention_pairs, attention_scores, window_params, windows
from autoshard.ops.payloads import PAYLOADS
from autoshard.ops.selection import top_k_order
from autoshard.ops.table import OP_KINDS, Attrs, Context, OpError, OpKind, Shape, normalize_dim, register

# compute(forward inputs, output gradient, forward context, wrt) -> gradient block of input `wrt`
GradCompute = Callable[[list[np.ndarray], np.ndarray, Context, int], np.ndarray]


@dataclass(frozen=True, slots=True)
class GradRule:
    compute: GradCompute
    differentiable: tuple[int, ...]  # the inputs a gradient exists for
    flops: Callable[[LoopNest, Attrs, int], float]  # of the forward nest and attributes, per differentiated input


GRAD_RULES: dict[str, GradRule] = {}


# --- elementwise: dy * f'(x) ------------------------------------------------------------
_sigmoid = PAYLOADS["sigmoid"].fn


def _gelu_slope(x: np.ndarray) -> np.ndarray:
    c, a = 0.7978845608028654, 0.044715  # the tanh approximation of the payload
    t = np.tanh(c * (x + a * x ** 3))
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * a * x * x)


def _gelu_erf_slope(x: np.ndarray) -> np.ndarray:
    # d/dx x * Phi(x) = Phi(x) + x * phi(x), phi the normal density
    return 0.5 * (1.0 + PAYLOADS["erf"].fn(x * 0.7071067811865476)) + x * np.exp(-0.5 * x * x) * 0.3989422804014327


def _silu_slope(x: np.ndarray) -> np.ndarray:
    s = _sigmoid(x)
    return s * (1.0 + x * (1.0 - s))


SLOPES: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "neg": lambda x: -np.ones_like(x),
    "abs": np.sign,
    "exp": np.exp,
    "log": lambda x: 1.0 / x,
    "sqrt": lambda x: 0.5 / np.sqrt(x),
    "rsqrt": lambda x: -0.5 * x ** -1.5,
    "tanh": lambda x: 1.0 - np.tanh(x) ** 2,
    "sin": np.cos,
    "cos": lambda x: -np.sin(x),
    "relu": lambda x: (x > 0).astype(x.dtype),
    "gelu": _gelu_slope,
    "erf": lambda x: 1.1283791670955126 * np.exp(-x * x),  # 2 / sqrt(pi) * exp(-x^2)
    "gelu_erf": _gelu_erf_slope,
    "sigmoid": lambda x: _sigmoid(x) * (1.0 - _sigmoid(x)),
    "silu": _silu_slope,
    "square": lambda x: 2.0 * x,
}


def _elementwise_rule(name: str) -> GradRule:
    slope = SLOPES[name]
    return GradRule(lambda inputs, dy, ctx, wrt: dy * slope(inputs[0]), (0,),
                    lambda nest, attrs, wrt: (PAYLOADS[name].flops + 1.0) * nest.points())


for _name in SLOPES:
    GRAD_RULES[_name] = _elementwise_rule(_name)


# --- pow: dy * p * x^(p - 1), for the base (the exponent is a number of the program) ------
def _pow_grad(inputs: list[np.ndarray], dy: np.ndarray, ctx: Context, wrt: int) -> np.ndarray:
    x, p = inputs
    grad = dy * p * np.power(x, p - 1)
    lead = grad.ndim - x.ndim  # summed back over the dims the base was broadcast along
    grad = grad.sum(axis=tuple(range(lead)))
    return grad.sum(axis=tuple(d for d, n in enumerate(x.shape) if n == 1 and grad.shape[d] != 1), keepdims=True)


GRAD_RULES["pow"] = GradRule(_pow_grad, (0,), lambda nest, attrs, wrt: (PAYLOADS["pow"].flops + 2.0) * nest.points())


# --- reduce_mean: the output gradient spread over the reduced dims, over their count ------
def _reduce_mean_grad(inputs: list[np.ndarray], dy: np.ndarray, ctx: Context, wrt: int) -> np.ndarray:
    reduced = ctx.nest.reduction_loops
    kept = [1 if loop in reduced else size for loop, size in enumerate(ctx.block.sizes)]
    count = float(np.prod([ctx.block.extents[loop] for loop in reduced]))  # global, as the forward op
    return np.broadcast_to(dy.reshape(kept), ctx.block.sizes) / count


GRAD_RULES["reduce_mean"] = GradRule(_reduce_mean_grad, (0,), lambda nest, attrs, wrt: float(nest.points()))


# --- layer_norm / rms_norm ---------------------------------------------------------------
def _norm_parts(inputs: list[np.ndarray], ctx: Context, centred: bool) -> tuple[np.ndarray, np.ndarray, int, list[int]]:
    """(x_hat, 1/std, dim, the shape a parameter broadcasts as)."""
    x = inputs[0]
    dim = normalize_dim(ctx.attrs.get("axis", -1), x.ndim)
    shape = [1] * x.ndim
    shape[dim] = -1
    centre = np.mean(x, axis=dim, keepdims=True) if centred else 0.0
    second = np.mean(np.square(x - centre), axis=dim, keepdims=True)
    inv_std = 1.0 / np.sqrt(second + ctx.attrs.get("eps", 1e-5 if centred else 1e-6))
    return (x - centre) * inv_std, inv_std, dim, shape


def _norm_grad(centred: bool) -> GradCompute:
    def compute(inputs: list[np.ndarray], dy: np.ndarray, ctx: Context, wrt: int) -> np.ndarray:
        x_hat, inv_std, dim, shape = _norm_parts(inputs, ctx, centred)
        others = tuple(d for d in range(dy.ndim) if d != dim)
        if wrt == 1:
            return np.sum(dy * x_hat, axis=others)
        if wrt == 2:
            return np.sum(dy, axis=others)
        g = dy * inputs[1].reshape(shape) if len(inputs) > 1 else dy
        mean = lambda v: np.mean(v, axis=dim, keepdims=True)  # noqa: E731
        return inv_std * ((g - mean(g) if centred else g) - x_hat * mean(g * x_hat))
    return compute


GRAD_RULES["layer_norm"] = GradRule(_norm_grad(True), (0, 1, 2), lambda nest, attrs, wrt: (10.0 if wrt == 0 else 3.0) * nest.points())
GRAD_RULES["rms_norm"] = GradRule(_norm_grad(False), (0, 1), lambda nest, attrs, wrt: (8.0 if wrt == 0 else 3.0) * nest.points())


# --- attention ---------------------------------------------------------------------------
# The weights P = exp(s - M) / l over the scores s, with M the row maximum and l the exponent
# sums; the softmax backward needs rowsum(P * dP) = u / l with u = rowsum(exp(s - M) * dP). All
# three are row statistics over the keys: with the key loop split each device computes its key
# block's part, combined by all_reduce (max for M, then sum for l and u), and from them its own
# gradient block, whole or partial as the grad nest says (dq sums over the keys; dk and dv are
# the block's own rows).
def _against(scores: np.ndarray, row_max: np.ndarray) -> np.ndarray:
    """exp(scores - M) per row; a row all masked (M = -inf) gives zeros."""
    return np.exp(scores - np.where(np.isneginf(row_max), 0.0, row_max)[..., None])


def _attention_sums(inputs: list[np.ndarray], dy: np.ndarray, ctx: Context,
                    row_max: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """This block's exponent sums l and u = rowsum(exp(s - M) * dP) against the row maximum M."""
    weights = _against(attention_scores(inputs, ctx), row_max)
    dp = np.einsum("bhse,bhte->bhst", dy, inputs[2])
    return weights.sum(axis=-1), (weights * dp).sum(axis=-1)


def _attention_grad_given(inputs: list[np.ndarray], dy: np.ndarray, ctx: Context, wrt: int,
                          row_max: np.ndarray, exp_sum: np.ndarray, dot_sum: np.ndarray) -> np.ndarray:
    """The gradient block from the row statistics of all the keys: dS = P * (dP - u / l). An
    added float mask's gradient is dS before the scale."""
    q, k, v = inputs[:3]
    scale = ctx.attrs.get("scale", 1.0 / np.sqrt(ctx.block.extents[5]))
    p = _against(attention_scores(inputs, ctx), row_max) / exp_sum[..., None]
    if wrt == 2:
        return np.einsum("bhst,bhse->bhte", p, dy)
    dp = np.einsum("bhse,bhte->bhst", dy, v)
    ds = p * (dp - (dot_sum / exp_sum)[..., None])
    if wrt == 3:  # an added mask (T5's position bias): the scores' gradient, summed where it broadcast
        mask = inputs[3]
        ds = ds.sum(axis=tuple(range(ds.ndim - mask.ndim)))
        return ds.sum(axis=tuple(d for d, n in enumerate(mask.shape) if n == 1 and ds.shape[d] != 1), keepdims=True)
    ds = ds * scale
    if wrt == 0:
        return np.einsum("bhst,bhtd->bhsd", ds, k)
    return np.einsum("bhst,bhsd->bhtd", ds, q)


def _attention_grad(inputs: list[np.ndarray], dy: np.ndarray, ctx: Context, wrt: int) -> np.ndarray:
    """Recompute the weights P, then dS = P * (dP - rowsum(P * dP)) with dP = dy v^T, every
    key in this block."""
    row_max = np.max(attention_scores(inputs, ctx), axis=-1)
    return _attention_grad_given(inputs, dy, ctx, wrt, row_max, *_attention_sums(inputs, dy, ctx, row_max))


def attention_key_axes(kind: str, attrs: Attrs, loop_axes: Sequence[Sequence[str]]) -> tuple[str, ...]:
    """The mesh axes an attention op or an attention gradient splits its key loop over (their key
    blocks then meet in the op's own combine); () for any other op or option."""
    if kind == "attention" or (kind == "grad" and attrs.get("of") == "attention"):
        return tuple(loop_axes[KEY_LOOP])
    return ()


def attention_grad_row_max(inputs: list[np.ndarray], ctx: Context) -> np.ndarray:
    """A grad-of-attention op's key block: its row maxima of the scores [B, H, S]."""
    fwd_inputs, _, fwd_ctx, _ = _forward_view(inputs, ctx)
    return np.max(attention_scores(fwd_inputs, fwd_ctx), axis=-1)


def attention_grad_sums(inputs: list[np.ndarray], ctx: Context,
                        row_max: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A grad-of-attention op's key block: its exponent sums l and u against the global row max."""
    fwd_inputs, dy, fwd_ctx, _ = _forward_view(inputs, ctx)
    return _attention_sums(fwd_inputs, dy, fwd_ctx, row_max)


def attention_grad_block(inputs: list[np.ndarray], ctx: Context, row_max: np.ndarray, exp_sum: np.ndarray,
                         dot_sum: np.ndarray) -> np.ndarray:
    """A grad-of-attention op's result on its key block, given the statistics of all the keys."""
    fwd_inputs, dy, fwd_ctx, wrt = _forward_view(inputs, ctx)
    grad = _attention_grad_given(fwd_inputs, dy, fwd_ctx, wrt, row_max, exp_sum, dot_sum)
    return np.asarray(grad).reshape(ctx.out_shapes[0])


def _attention_grad_flops(nest: LoopNest, attrs: Attrs, wrt: int) -> float:
    pairs, e, d = attention_pairs(nest, attrs), nest.extents[3], nest.extents[5]
    scores, values, softmax = 2.0 * pairs * d, 2.0 * pairs * e, 5.0 * pairs
    # each gradient recomputes the weights; q and k also need dP and the softmax backward
    if wrt == 3:  # dP and the softmax backward
        return scores + softmax + values + 3.0 * pairs
    return scores + softmax + values + (values + scores + 3.0 * pairs if wrt in (0, 1) else 0.0)


GRAD_RULES["attention"] = GradRule(_attention_grad, (0, 1, 2, 3), _attention_grad_flops)


# --- embedding: scatter-add of the output gradient into the looked-up rows -----------------
def _embedding_grad(inputs: list[np.ndarray], dy: np.ndarray, ctx: Context, wrt: int) -> np.ndarray:
    ids = inputs[0].astype(np.int64) - ctx.block.starts[-1]  # rows of this block of the vocabulary
    rows, width = ctx.block.sizes[-1], ctx.block.sizes[-2]
    out = np.zeros((rows, width), dtype=dy.dtype)
    hit = (ids >= 0) & (ids < rows)
    np.add.at(out, ids[hit], dy[hit])
    return out


GRAD_RULES["embedding"] = GradRule(_embedding_grad, (1,), lambda nest, attrs, wrt: float(np.prod(nest.extents[:-1])))


# --- convolution (filter) and pooling (input) ---------------------------------------------
def _conv_filter_grad(inputs: list[np.ndarray], dy: np.ndarray, ctx: Context, wrt: int) -> np.ndarray:
    """dw[k] = sum over n and outputs of the window at offset k times dy; the input arrives padded
    to the windows' reach."""
    x, w = inputs
    rank = x.ndim - 2
    strides, _ = window_params(ctx.attrs, rank)
    batch_and_space = list(range(rank + 1))
    out = np.zeros(w.shape, dtype=np.result_type(x, dy))
    for at in np.ndindex(*w.shape[:rank]):
        out[at] = np.tensordot(windows(x, at, strides, dy.shape[1:-1]), dy, axes=(batch_and_space, batch_and_space))
    return out


for _rank in (1, 2, 3):
    GRAD_RULES[f"conv{_rank}d"] = GradRule(_conv_filter_grad, (1,), lambda nest, attrs, wrt: 2.0 * nest.points())


def _pool_grad(is_max: bool) -> GradCompute:
    def compute(inputs: list[np.ndarray], dy: np.ndarray, ctx: Context, wrt: int) -> np.ndarray:
        """dy spread back over each window: to the cells equal to the window's maximum (every one
        of them on a tie), or evenly (average)."""
        (x,) = inputs
        strides, _ = window_params(ctx.attrs, 2, ctx.block.sizes[4:6])
        kernel, out_shape = ctx.block.sizes[4:6], dy.shape[1:3]
        top = np.max([windows(x, at, strides, out_shape) for at in np.ndindex(*kernel)], axis=0) if is_max else None
        dx = np.zeros(x.shape, dtype=dy.dtype)
        for at in np.ndindex(*kernel):
            share = dy * (windows(x, at, strides, out_shape) == top) if is_max else dy / np.prod(kernel)
            windows(dx, at, strides, out_shape)[...] += share
        return dx
    return compute


GRAD_RULES["max_pool2d"] = GradRule(_pool_grad(True), (0,), lambda nest, attrs, wrt: 2.0 * nest.points())
GRAD_RULES["avg_pool2d"] = GradRule(_pool_grad(False), (0,), lambda nest, attrs, wrt: float(nest.points()))


# --- top k values: the output gradient back at the picked positions ------------------------
def _top_k_values_grad(inputs: list[np.ndarray], dy: np.ndarray, ctx: Context, wrt: int) -> np.ndarray:
    (x,) = inputs  # whole rows: the selection loops are never split
    dx = np.zeros(x.shape, dtype=dy.dtype)
    np.put_along_axis(dx, top_k_order(x, ctx.attrs["k"]), dy, axis=-1)
    return dx


GRAD_RULES["top_k_values"] = GradRule(_top_k_values_grad, (0,),
                                      lambda nest, attrs, wrt: float(nest.points() // nest.extents[-2]))


# --- the row -----------------------------------------------------------------------------
def _forward(attrs: Attrs) -> tuple[OpKind, GradRule, Attrs, int]:
    of = attrs.get("of")
    if of not in GRAD_RULES:
        raise OpError(f"attribute 'of' must name a kind with a gradient rule, one of {sorted(GRAD_RULES)}; got {of!r}", "of")
    forward = attrs.get("forward", {})
    if not isinstance(forward, dict):
        raise OpError(f"attribute 'forward' must be an object of {of} attributes, got {forward!r}", "forward")
    kind = OP_KINDS[of]
    for name in forward:
        if name not in kind.attrs:
            raise OpError(f"{of} takes no attribute {name!r}" + (f"; it takes {list(kind.attrs)}" if kind.attrs else ""), "forward")
    wrong = attribute_problems(forward)
    if wrong:
        name = next(iter(wrong))
        raise OpError(wrong[name], f"forward/{name}")
    wrt = attrs.get("wrt")
    rule = GRAD_RULES[of]
    if not isinstance(wrt, int) or isinstance(wrt, bool) or wrt not in rule.differentiable:
        raise OpError(f"attribute 'wrt' must be the index of a differentiable {of} input, one of {list(rule.differentiable)}; got {wrt!r}", "wrt")
    return kind, rule, forward, wrt


def _grad_loops(shapes: Sequence[Shape], attrs: Attrs) -> LoopNest:
    kind, _, forward, wrt = _forward(attrs)
    inputs = list(shapes[:-1])
    low, high = kind.num_inputs
    if not shapes or len(inputs) < low or (high is not None and len(inputs) > high) or wrt >= len(inputs):
        raise OpError(f"expected the {kind.name} inputs then the output gradient, with input {wrt} among them; got {len(shapes)} inputs")
    nest = kind.loops(inputs, forward)
    if tuple(shapes[-1]) != nest.output_shapes()[0]:
        raise OpError(f"the output gradient (last input) must have the {kind.name} output shape {list(nest.output_shapes()[0])}, "
                      f"got {list(shapes[-1])}")
    target = nest.input_maps[wrt]
    indexed = {loop for expr in target.results for loop in expr.loops}
    # A loop the forward combines itself (attention's keys) is an ordinary one here: the gradient
    # combines only row statistics first (`attention_grad_sums`), then sums or writes as any other.
    iterators = tuple(INVALID if t == INVALID else PARALLEL if loop in indexed else REDUCTION
                      for loop, t in enumerate(nest.iterator_types))
    shapes_known = nest.input_shapes + nest.output_shapes() if nest.input_shapes else ()
    return LoopNest(nest.extents, iterators, nest.input_maps + nest.output_maps, (target,), input_shapes=shapes_known)


def _forward_view(inputs: list[np.ndarray], ctx: Context) -> tuple[list[np.ndarray], np.ndarray, Context, int]:
    """A grad op's block as its forward op's: the forward inputs, the output gradient, the
    forward's context on the same block, and `wrt`."""
    kind, _, forward, wrt = _forward(ctx.attrs)
    *fwd_inputs, dy = inputs
    # The forward op over the same loops: its global input shapes are its maps' reach.
    maps: tuple[AffineMap, ...] = ctx.nest.input_maps[:-1]
    shapes = ctx.nest.input_shapes[:-1] or [map_extent(m, ctx.block.extents) for m in maps]
    nest = kind.loops(list(shapes), forward)
    return fwd_inputs, dy, Context(nest, ctx.block, forward, (map_extent(nest.output_maps[0], ctx.block.sizes),)), wrt


def _grad_compute(inputs: list[np.ndarray], ctx: Context) -> list[np.ndarray]:
    fwd_inputs, dy, fwd_ctx, wrt = _forward_view(inputs, ctx)
    grad = GRAD_RULES[ctx.attrs["of"]].compute(fwd_inputs, dy, fwd_ctx, wrt)
    return [np.asarray(grad).reshape(ctx.out_shapes[0])]


def _grad_flops(nest: LoopNest, attrs: Attrs) -> float:
    kind, rule, forward, wrt = _forward(attrs)
    return rule.flops(nest, forward, wrt)


def _grad_dtype(in_dtypes: Sequence[str], attrs: Attrs) -> tuple[str, ...]:
    _, _, _, wrt = _forward(attrs)
    return (in_dtypes[wrt],)


def _grad_block_share(nest: LoopNest, attrs: Attrs, splits: Sequence[int]) -> float:
    # the forward's loops, and its work over them: a causal attention's gradient is uneven as it is
    kind, _, forward, _ = _forward(attrs)
    return kind.block_share(nest, forward, splits)


def _grad_fill(attrs: Attrs) -> str | None:
    kind, _, forward, _ = _forward(attrs)
    return kind.window_fill(forward)


register(OpKind("grad", (2, None), _grad_loops, _grad_compute, _grad_flops, _grad_dtype, attrs=("of", "wrt", "forward"),
                window_fill=_grad_fill, block_share=_grad_block_share,
                doc="gradient of a table op (attribute of) w.r.t. input wrt; inputs: the forward inputs, then the output gradient"))
