"""Reverse-mode differentiation of a built graph into explicit gradient ops.

Walking the ops backwards from the given output gradients, each op adds the ops that compute
its inputs' gradients: contractions become the two contractions of their transposed products
(`dot_general`), broadcasting ops sum the broadcast dims away, data movement moves the gradient
back, softmax uses its closed form; what needs constants or masks (elementwise slopes, norms,
attention, embedding, means) is a `grad` op. Gradients reaching one tensor along several paths
are added.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence

from autoshard.dtypes import DTYPES
from autoshard.ops.grads import GRAD_RULES
from autoshard.ops.table import OpDecl, normalize_dim


class GraphBuilder(Protocol):
    """What differentiation needs of a graph under construction (`autoshard.graph.builder`
    implements it): the ops so far in program order, tensor shapes, and adding an op."""

    ops: Sequence[OpDecl]
    layer: int | None  # the layer of the ops being added
    layers: dict[str, int]  # op -> its layer

    def shape(self, tensor: str) -> tuple[int, ...]: ...

    def dtype_of(self, tensor: str) -> str: ...

    def op(self, kind: str, inputs: Sequence[str], name: str, **attrs: Any) -> str: ...

# rule(builder, op, input index, output gradient) -> gradient of that input
Rule = Callable[[GraphBuilder, OpDecl, int, str], str]


def add_backward(b: GraphBuilder, seeds: dict[str, str], wrt: Sequence[str]) -> dict[str, str]:
    """Gradients of the tensors `wrt`, given the gradients `seeds` of some tensors built so far."""
    needed = depends_on(b, set(wrt))
    pending: dict[str, list[str]] = {t: [g] for t, g in seeds.items()}
    outer = b.layer
    for op in reversed(list(b.ops)):
        if op.output not in pending:
            continue
        dy = _total(b, op.output, pending.pop(op.output))
        # an op's gradient ops belong to its layer
        b.layer = b.layers.get(op.name)
        for index, tensor in enumerate(op.inputs):
            if tensor in needed:
                pending.setdefault(tensor, []).append(_rule(op)(b, op, index, dy))
    missing = [t for t in wrt if t not in pending]
    if missing:
        raise ValueError(f"no gradient reaches {missing}: they do not feed the differentiated outputs")
    grads = {t: _total(b, t, pending[t]) for t in wrt}
    b.layer = outer
    return grads


def depends_on(b: GraphBuilder, sources: set[str]) -> set[str]:
    """The float tensors computed from `sources`: integers and bools carry no gradient (the
    indices a top-k picks, a comparison), so the ops reading only them need no rule."""
    reached = set(sources)
    for op in b.ops:
        if any(t in reached for t in op.inputs) and DTYPES[b.dtype_of(op.output)].is_float:
            reached.add(op.output)
    return reached


def _total_layer(b: GraphBuilder, parts: Sequence[str]) -> int | None:
    """Gradients summed for one tensor belong to the least layer among the ops that read it in the
    forward pass (the layer whose backward completes the sum), found through the parts' layers."""
    found = [b.layers[p] for p in parts if p in b.layers]
    return min(found, default=None)


def _total(b: GraphBuilder, tensor: str, parts: list[str]) -> str:
    if len(parts) > 1:
        b.layer = _total_layer(b, parts)
    total = parts[0]
    for part in parts[1:]:
        total = b.op("add", [total, part], f"grad.{tensor}.sum")
    return total


def _rule(op: OpDecl) -> Rule:
    if op.kind in RULES:
        return RULES[op.kind]
    if op.kind in GRAD_RULES:
        return _grad_op
    raise ValueError(f"op {op.name!r}: no gradient for kind {op.kind!r}")


def _name(op: OpDecl, index: int) -> str:
    return f"grad.{op.name}.{index}"


def _grad_op(b: GraphBuilder, op: OpDecl, index: int, dy: str) -> str:
    attrs = {"of": op.kind, "wrt": index} | ({"forward": dict(op.attrs)} if op.attrs else {})
    return b.op("grad", [*op.inputs, dy], _name(op, index), **attrs)


# --- contractions -------------------------------------------------------------------------
def _dimension_numbers(b: GraphBuilder, op: OpDecl) -> tuple[list[int], list[int], list[int], list[int]]:
    """(lhs batch, rhs batch, lhs contracting, rhs contracting) of a matmul-like op."""
    lhs, rhs = (len(b.shape(t)) for t in op.inputs)
    if op.kind == "matmul":
        return [], [], [lhs - 1], [0]
    if op.kind == "batch_matmul":
        batch = list(range(lhs - 2))
        return batch, batch, [lhs - 1], [rhs - 2]
    a = op.attrs
    return (list(a.get("lhs_batch_dims", [])), list(a.get("rhs_batch_dims", [])),
            list(a["lhs_contracting_dims"]), list(a["rhs_contracting_dims"]))


def _contraction(b: GraphBuilder, op: OpDecl, index: int, dy: str) -> str:
    """The gradient of one operand is the contraction of dy with the other over the other's
    free dims; its dims come out as (batch, free, contracted-with-the-other), then transposed."""
    lb, rb, lc, rc = _dimension_numbers(b, op)
    lhs, rhs = op.inputs
    nb = len(lb)
    lf = [d for d in range(len(b.shape(lhs))) if d not in lb and d not in lc]
    rf = [d for d in range(len(b.shape(rhs))) if d not in rb and d not in rc]
    if index == 0:
        grad = b.op("dot_general", [dy, rhs], _name(op, 0),
                    lhs_batch_dims=list(range(nb)), rhs_batch_dims=rb,
                    lhs_contracting_dims=list(range(nb + len(lf), nb + len(lf) + len(rf))), rhs_contracting_dims=rf)
        position = {d: i for i, d in enumerate(lb)} | {d: nb + j for j, d in enumerate(lf)} \
            | {d: nb + len(lf) + sorted(rc).index(r) for d, r in zip(lc, rc)}
        rank = len(b.shape(lhs))
    else:
        grad = b.op("dot_general", [lhs, dy], _name(op, 1),
                    lhs_batch_dims=lb, rhs_batch_dims=list(range(nb)),
                    lhs_contracting_dims=lf, rhs_contracting_dims=list(range(nb, nb + len(lf))))
        position = {d: i for i, d in enumerate(rb)} | {d: nb + sorted(lc).index(l) for l, d in zip(lc, rc)} \
            | {d: nb + len(lc) + j for j, d in enumerate(rf)}
        rank = len(b.shape(rhs))
    perm = [position[d] for d in range(rank)]
    return grad if perm == sorted(perm) else b.op("transpose", [grad], f"{grad}.transpose", perm=perm)


# --- broadcasting elementwise -------------------------------------------------------------
def unbroadcast(b: GraphBuilder, grad: str, shape: tuple[int, ...], name: str) -> str:
    """Sum a gradient of the broadcast shape down to an operand of `shape` (numpy rules)."""
    full = b.shape(grad)
    lead = len(full) - len(shape)
    dims = list(range(lead)) + [lead + i for i, s in enumerate(shape) if s == 1 and full[lead + i] != 1]
    if dims:
        grad = b.op("reduce_sum", [grad], f"{name}.sum", dims=dims)
    if b.shape(grad) != shape:
        grad = b.op("reshape", [grad], f"{name}.reshape", shape=list(shape))
    return grad


def _add(b: GraphBuilder, op: OpDecl, index: int, dy: str) -> str:
    return unbroadcast(b, dy, b.shape(op.inputs[index]), _name(op, index))


def _sub(b: GraphBuilder, op: OpDecl, index: int, dy: str) -> str:
    grad = dy if index == 0 else b.op("neg", [dy], f"{_name(op, index)}.neg")
    return unbroadcast(b, grad, b.shape(op.inputs[index]), _name(op, index))


def _mul(b: GraphBuilder, op: OpDecl, index: int, dy: str) -> str:
    grad = b.op("mul", [dy, op.inputs[1 - index]], f"{_name(op, index)}.mul")
    return unbroadcast(b, grad, b.shape(op.inputs[index]), _name(op, index))


def _select(b: GraphBuilder, op: OpDecl, index: int, dy: str) -> str:
    """The output gradient where the selector picked case `index`, zero where it picked another
    (input 0, the selector, is a bool or an integer: it has none)."""
    zeros = b.op("sub", [dy, dy], f"{_name(op, index)}.zero")
    cases = [dy if case == index else zeros for case in range(1, len(op.inputs))]
    grad = b.op("select", [op.inputs[0], *cases], f"{_name(op, index)}.pick")
    return unbroadcast(b, grad, b.shape(op.inputs[index]), _name(op, index))


def _div(b: GraphBuilder, op: OpDecl, index: int, dy: str) -> str:
    # d(a/b)/da = 1/b; d(a/b)/db = -(a/b)/b
    name = _name(op, index)
    grad = b.op("div", [dy, op.inputs[1]], f"{name}.div")
    if index == 1:
        grad = b.op("neg", [b.op("mul", [grad, op.output], f"{name}.mul")], f"{name}.neg")
    return unbroadcast(b, grad, b.shape(op.inputs[index]), name)


def _exp(b: GraphBuilder, op: OpDecl, index: int, dy: str) -> str:
    return b.op("mul", [dy, op.output], _name(op, index))


def _neg(b: GraphBuilder, op: OpDecl, index: int, dy: str) -> str:
    return b.op("neg", [dy], _name(op, index))


def _softmax(b: GraphBuilder, op: OpDecl, index: int, dy: str) -> str:
    # dx = y * (dy - sum(dy * y)) over the softmax dim
    name, y = _name(op, index), op.output
    dim = normalize_dim(op.attrs.get("axis", -1), len(b.shape(y)))
    dot = b.op("reduce_sum", [b.op("mul", [dy, y], f"{name}.mul")], f"{name}.sum", dims=[dim], keepdims=True)
    return b.op("mul", [y, b.op("sub", [dy, dot], f"{name}.sub")], name)


# --- data movement and sums ---------------------------------------------------------------
def _reshape(b: GraphBuilder, op: OpDecl, index: int, dy: str) -> str:
    return b.op("reshape", [dy], _name(op, index), shape=list(b.shape(op.inputs[0])))


def _transpose(b: GraphBuilder, op: OpDecl, index: int, dy: str) -> str:
    perm = list(op.attrs.get("perm", reversed(range(len(b.shape(dy))))))
    return b.op("transpose", [dy], _name(op, index), perm=[perm.index(d) for d in range(len(perm))])


def _cast(b: GraphBuilder, op: OpDecl, index: int, dy: str) -> str:
    return b.op("cast", [dy], _name(op, index), dtype=b.dtype_of(op.inputs[0]))


def _reduce_sum(b: GraphBuilder, op: OpDecl, index: int, dy: str) -> str:
    shape = b.shape(op.inputs[0])
    dims = {normalize_dim(d, len(shape), "dims") for d in op.attrs.get("dims", range(len(shape)))}
    kept = list(range(len(shape))) if op.attrs.get("keepdims", False) else [d for d in range(len(shape)) if d not in dims]
    return b.op("broadcast_in_dim", [dy], _name(op, index), shape=list(shape), broadcast_dimensions=kept)


def _broadcast_in_dim(b: GraphBuilder, op: OpDecl, index: int, dy: str) -> str:
    source, out = b.shape(op.inputs[0]), b.shape(dy)
    dims = list(op.attrs.get("broadcast_dimensions", range(len(out) - len(source), len(out))))
    if dims != sorted(dims):
        raise ValueError(f"op {op.name!r}: the gradient of a broadcast_in_dim that reorders dims is not supported")
    summed = [d for d in range(len(out)) if d not in dims] + [d for s, d in zip(source, dims) if s == 1 and out[d] != 1]
    name = _name(op, index)
    grad = b.op("reduce_sum", [dy], f"{name}.sum", dims=sorted(summed)) if summed else dy
    return grad if b.shape(grad) == source else b.op("reshape", [grad], name, shape=list(source))


def _concat(b: GraphBuilder, op: OpDecl, index: int, dy: str) -> str:
    """Input `index`'s gradient is its own range of dy along the concatenated dim."""
    shape = b.shape(dy)
    dim = normalize_dim(op.attrs.get("axis", 0), len(shape))
    start = sum(b.shape(t)[dim] for t in op.inputs[:index])
    starts, limits = [0] * len(shape), list(shape)
    starts[dim], limits[dim] = start, start + b.shape(op.inputs[index])[dim]
    return b.op("slice", [dy], _name(op, index), starts=starts, limits=limits)


def _pad_grad(b: GraphBuilder, op: OpDecl, index: int, dy: str) -> str:
    shape = b.shape(op.inputs[0])
    low = list(op.attrs.get("low", [0] * len(shape)))
    return b.op("slice", [dy], _name(op, index), starts=low, limits=[a + n for a, n in zip(low, shape)])


def _slice(b: GraphBuilder, op: OpDecl, index: int, dy: str) -> str:
    """dy back in place: zeros around it, and between its elements where the slice strides."""
    shape = b.shape(op.inputs[0])
    starts = list(op.attrs.get("starts", [0] * len(shape)))
    strides = list(op.attrs.get("strides", [1] * len(shape)))
    name = _name(op, index)
    grad = dy
    for dim, stride in enumerate(strides):
        if stride != 1:
            grad = _spread(b, grad, dim, stride, shape[dim] - starts[dim], f"{name}.spread{dim}")
    out = b.shape(grad)
    high = [n - a - m for n, a, m in zip(shape, starts, out)]
    return b.op("pad", [grad], name, low=starts, high=high)


def _spread(b: GraphBuilder, grad: str, dim: int, stride: int, room: int, name: str) -> str:
    """`grad`'s elements `stride` apart along `dim`, zeros between them, cut to `room`: each
    element gets a new dim of size `stride` padded with zeros after it, then the two dims merge."""
    shape = list(b.shape(grad))
    rank, m = len(shape), shape[dim]
    grad = b.op("reshape", [grad], f"{name}.split", shape=shape[:dim + 1] + [1] + shape[dim + 1:])
    high = [0] * (rank + 1)
    high[dim + 1] = stride - 1
    grad = b.op("pad", [grad], f"{name}.pad", low=[0] * (rank + 1), high=high)
    spread = shape[:dim] + [m * stride] + shape[dim + 1:]
    grad = b.op("reshape", [grad], f"{name}.merge", shape=spread)
    if m * stride <= room:
        return grad
    return b.op("slice", [grad], name, starts=[0] * rank, limits=spread[:dim] + [room] + spread[dim + 1:])


def _norm(b: GraphBuilder, op: OpDecl, index: int, dy: str) -> str:
    if index < 2:
        return _grad_op(b, op, index, dy)
    # the shift's gradient is the output gradient summed over every dim but the normalised one
    rank = len(b.shape(dy))
    dim = normalize_dim(op.attrs.get("axis", -1), rank)
    return b.op("reduce_sum", [dy], _name(op, index), dims=[d for d in range(rank) if d != dim])


# --- windows ------------------------------------------------------------------------------
def _conv(b: GraphBuilder, op: OpDecl, index: int, dy: str) -> str:
    """The filter's gradient is a `grad` op; the input's is the convolution of dy, spread out by
    the strides (zeros between its elements), with the filter reversed in space and its channels
    swapped, padded by kernel - 1 - pad on each side (a full correlation; after the input's end
    also by the positions past the last window the strides reached), so it splits with halos as
    the forward one does."""
    if index == 1:
        return _grad_op(b, op, index, dy)
    w_shape, x_shape, y_shape = b.shape(op.inputs[1]), b.shape(op.inputs[0]), b.shape(dy)
    rank = len(w_shape) - 2
    strides = list(op.attrs.get("strides", [1] * rank))
    pad = [list(p) for p in op.attrs.get("padding", [[0, 0]] * rank)]
    past = [n + a + c - k - (m - 1) * s for n, m, k, s, (a, c) in zip(x_shape[1:], y_shape[1:], w_shape, strides, pad)]
    grown = [[k - 1 - a, k - 1 - c + r] for k, (a, c), r in zip(w_shape, pad, past)]
    if min(v for p in grown for v in p) < 0:
        raise ValueError(f"op {op.name!r}: the input gradient of a convolution needs padding at most kernel - 1 per "
                         f"side; got padding {pad}")
    name = _name(op, index)
    for d, stride in enumerate(strides):
        if stride != 1:
            dy = _spread(b, dy, 1 + d, stride, (y_shape[1 + d] - 1) * stride + 1, f"{name}.spread{d}")
    flipped = b.op("reverse", [op.inputs[1]], f"{name}.reverse", dims=list(range(rank)))
    perm = list(range(rank)) + [rank + 1, rank]
    swapped = b.op("transpose", [flipped], f"{name}.filter", perm=perm)
    return b.op(op.kind, [dy, swapped], name, strides=[1] * rank, padding=grown)


def _pool(b: GraphBuilder, op: OpDecl, index: int, dy: str) -> str:
    """A `grad` op, when the windows tile the input (a result written through overlapping or
    padded windows would not be the input's shape)."""
    window = list(op.attrs.get("window", []))
    strides = list(op.attrs.get("strides", window))
    pad = op.attrs.get("padding", [[0, 0], [0, 0]])
    shape, out = b.shape(op.inputs[0]), b.shape(op.output)
    if strides != window or any(a or c for a, c in pad) or any(o * s != n for o, s, n in zip(out[1:3], strides, shape[1:3])):
        raise ValueError(f"op {op.name!r}: the gradient of a pooling needs windows that tile the input (strides = "
                         f"window, no padding, sizes a multiple of the window); got window {window}, strides "
                         f"{strides}, padding {pad}, input {list(shape)}")
    return _grad_op(b, op, index, dy)


RULES: dict[str, Rule] = {
    "conv1d": _conv, "conv2d": _conv, "conv3d": _conv, "max_pool2d": _pool, "avg_pool2d": _pool,
    "matmul": _contraction, "batch_matmul": _contraction, "dot_general": _contraction,
    "add": _add, "sub": _sub, "mul": _mul, "div": _div, "select": _select, "exp": _exp, "neg": _neg, "softmax": _softmax,
    "reshape": _reshape, "transpose": _transpose, "cast": _cast, "reduce_sum": _reduce_sum,
    "broadcast_in_dim": _broadcast_in_dim, "layer_norm": _norm, "concat": _concat,
    "slice": _slice, "pad": _pad_grad,
}
