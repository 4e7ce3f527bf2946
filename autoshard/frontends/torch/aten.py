"""The aten table: one row per aten op, lowering an FX node to rows of autoshard's op table.

A row takes the lowering context and the node and returns the graph tensor holding the node's
value. Rows never compute shapes: the op table derives them, and the importer checks them
against the shapes torch.export recorded. A row raises `Unsupported` for a use of its op it does
not lower exactly (the node is then kept opaque); an op with no row is opaque too.

The key of a row is the aten overload without its namespace (`linear.default`), or `getitem`.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from autoshard.frontends.torch.lowering import Lowering, Unsupported
from autoshard.frontends.torch.runtime import require_torch
from autoshard.frontends.torch.values import dtype_name, value_shape

torch = require_torch()
aten = torch.ops.aten
from torch.distributed.tensor import DTensor, Replicate  # noqa: E402  (after the check that torch is there)

Row = Callable[[Lowering, Any], str]
ATEN: dict[str, Row] = {}


def target_key(target: Any) -> str:
    """`aten.linear.default` -> `linear.default` (an overload's name); `operator.getitem` -> `getitem`."""
    return getattr(target, "__name__", str(target))


def row(*keys: str) -> Callable[[Row], Row]:
    def add(fn: Row) -> Row:
        for key in keys:
            assert key not in ATEN, key
            ATEN[key] = fn
        return fn
    return add


def arg(node: Any, index: int, name: str, default: Any = None) -> Any:
    """Argument `index` of the node, given positionally or by keyword `name`."""
    if index < len(node.args):
        return node.args[index]
    return node.kwargs.get(name, default)


def out_shape(node: Any) -> list[int]:
    return value_shape(node.meta["val"])


def rank(lw: Lowering, tensor: str) -> int:
    return len(lw.shape(tensor))


# A complex value is held as a real one with a trailing dim of 2 (`autoshard.frontends.torch.values`);
# rows outside COMPLEX_ROWS do not lower an op that reads or makes one.
COMPLEX_ROWS = ("view_as_complex.default", "view_as_real.default", "mul.Tensor", "view.default", "reshape.default",
                "_unsafe_view.default", "unsqueeze.default", "clone.default", "alias.default")


# --- no-ops and aliases: the value is the input's -------------------------------------
@row("view_as_complex.default", "view_as_real.default")
def _as_complex_or_real(lw: Lowering, node: Any) -> str:
    """The same numbers, held as they are: a complex value already has its parts in a trailing dim."""
    return lw.tensor(node.args[0])


@row("clone.default", "alias.default", "detach.default", "contiguous.default", "lift_fresh_copy.default",
     "dropout.default")
def _alias(lw: Lowering, node: Any) -> str:
    if target_key(node.target) == "dropout.default" and arg(node, 2, "train", False) and arg(node, 1, "p", 0.0) > 0:
        raise Unsupported("dropout in training mode is random")
    return lw.tensor(node.args[0])


@row("_to_copy.default", "to.dtype", "to.dtype_layout", "type_as.default")
def _to(lw: Lowering, node: Any) -> str:
    x = lw.tensor(node.args[0])
    dtype = dtype_name(node.meta["val"].dtype)
    if dtype == lw.builder.dtype_of(x):
        return x
    target = node.meta["val"].dtype
    return lw.op("cast", [x], node.name, lambda t: aten._to_copy.default(t, dtype=target), dtype=dtype)


# --- contractions ----------------------------------------------------------------------
@row("linear.default")
def _linear(lw: Lowering, node: Any) -> str:
    """x [..., K] with W [N, K] (nn.Linear's layout): a dot_general over K, then the bias added
    once, after the contraction (so a split K leaves a partial sum to reduce before the bias)."""
    x, w = lw.tensor(node.args[0]), lw.tensor(node.args[1])
    bias = arg(node, 2, "bias")
    name = f"{node.name}.matmul" if bias is not None else node.name
    y = lw.op("dot_general", [x, w], name, lambda a, b: aten.linear.default(a, b),
              lhs_contracting_dims=[rank(lw, x) - 1], rhs_contracting_dims=[1])
    if bias is None:
        return y
    return lw.op("add", [y, lw.tensor(bias)], node.name, aten.add.Tensor)


@row("addmm.default")
def _addmm(lw: Lowering, node: Any) -> str:
    if arg(node, 3, "beta", 1) != 1 or arg(node, 4, "alpha", 1) != 1:
        raise Unsupported("addmm with beta or alpha other than 1")
    bias, x, w = (lw.tensor(a) for a in node.args[:3])
    y = lw.op("matmul", [x, w], f"{node.name}.matmul", aten.mm.default)
    return lw.op("add", [y, bias], node.name, aten.add.Tensor)


@row("mm.default")
def _mm(lw: Lowering, node: Any) -> str:
    return lw.op("matmul", [lw.tensor(a) for a in node.args[:2]], node.name, aten.mm.default)


@row("bmm.default")
def _bmm(lw: Lowering, node: Any) -> str:
    return lw.op("batch_matmul", [lw.tensor(a) for a in node.args[:2]], node.name, aten.bmm.default)


@row("baddbmm.default")
def _baddbmm(lw: Lowering, node: Any) -> str:
    """beta * input + alpha * (batch1 @ batch2): the contraction, then its scaling and the bias
    added once after it (so a split contraction dim leaves a partial sum to reduce first)."""
    bias, b1, b2 = (lw.tensor(a) for a in node.args[:3])
    beta, alpha = arg(node, 3, "beta", 1), arg(node, 4, "alpha", 1)
    y = lw.op("batch_matmul", [b1, b2], f"{node.name}.bmm", aten.bmm.default)
    if alpha != 1:
        y = lw.op("mul", [y, lw.scalar(alpha, y, f"{node.name}.alpha")], f"{node.name}.scaled", aten.mul.Tensor)
    if beta == 0:  # torch ignores the input then, even its infinities and NaNs
        return y
    if beta != 1:
        bias = lw.op("mul", [bias, lw.scalar(beta, bias, f"{node.name}.beta")], f"{node.name}.bias", aten.mul.Tensor)
    return lw.op("add", [y, bias], node.name, aten.add.Tensor)


@row("matmul.default")
def _matmul(lw: Lowering, node: Any) -> str:
    a, b = (lw.tensor(x) for x in node.args[:2])
    ra, rb = rank(lw, a), rank(lw, b)
    if ra >= 2 and rb == 2:
        return lw.op("matmul", [a, b], node.name, aten.matmul.default)
    if ra == rb >= 3 and lw.shape(a)[:-2] == lw.shape(b)[:-2]:
        return lw.op("batch_matmul", [a, b], node.name, aten.matmul.default)
    raise Unsupported(f"matmul of ranks {ra} and {rb} with broadcast batch dims")


# --- elementwise -----------------------------------------------------------------------
_UNARY = {"neg": "neg", "exp": "exp", "log": "log", "sqrt": "sqrt", "rsqrt": "rsqrt", "tanh": "tanh",
          "relu": "relu", "sigmoid": "sigmoid", "silu": "silu", "abs": "abs", "gelu": "gelu", "erf": "erf"}


def _unary(kind: str) -> Row:
    def lower(lw: Lowering, node: Any) -> str:
        rest, kwargs = node.args[1:], dict(node.kwargs)
        # gelu is the exact form (x * Phi(x)) unless it asks for the tanh approximation
        exact = kind == "gelu" and arg(node, 1, "approximate", "none") == "none"
        return lw.op("gelu_erf" if exact else kind, [lw.tensor(node.args[0])], node.name,
                     lambda x: node.target(x, *rest, **kwargs))
    return lower


for _name, _kind in _UNARY.items():
    row(f"{_name}.default")(_unary(_kind))

_BINARY = {"add": "add", "sub": "sub", "mul": "mul", "div": "div", "maximum": "max", "minimum": "min"}


def _binary(kind: str) -> Row:
    def lower(lw: Lowering, node: Any) -> str:
        if arg(node, 2, "alpha", 1) != 1 or node.kwargs.get("rounding_mode") is not None:
            raise Unsupported("alpha or rounding_mode")
        a, b = node.args[:2]
        if node.meta["val"].is_complex():
            return _complex_mul(lw, node)
        like = lw.tensor(a) if not isinstance(a, (int, float)) else lw.tensor(b)
        inputs = [lw.operand(a, like, f"{node.name}.self"), lw.operand(b, like, f"{node.name}.other")]
        return lw.op(kind, inputs, node.name, lambda x, y: node.target(x, y))
    return lower


for _name, _kind in _BINARY.items():
    keys = [f"{_name}.Tensor", f"{_name}.Scalar"] if _name not in ("maximum", "minimum") else [f"{_name}.default"]
    row(*keys)(_binary(_kind))


def _complex_mul(lw: Lowering, node: Any) -> str:
    """(a + bi)(c + di) = (ac - bd) + (ad + bc)i on the parts in the trailing dim; a complex
    value times a real number scales both parts."""
    x, y = node.args[:2]
    if isinstance(y, (int, float)) and not isinstance(y, bool):
        t = lw.tensor(x)
        return lw.op("mul", [t, lw.scalar(y, t, f"{node.name}.other")], node.name, aten.mul.Tensor)
    if not all(hasattr(v, "meta") and v.meta["val"].is_complex() for v in (x, y)):
        raise Unsupported("a complex value times a real tensor")
    parts = [_complex_part(lw, lw.tensor(v), i, f"{node.name}.{side}.{part}")
             for side, v in (("self", x), ("other", y)) for i, part in enumerate(("re", "im"))]
    a, b, c, d = parts

    def times(u: str, v: str, name: str) -> str:
        return lw.op("mul", [u, v], f"{node.name}.{name}", aten.mul.Tensor)
    re = lw.op("sub", [times(a, c, "ac"), times(b, d, "bd")], f"{node.name}.re", aten.sub.Tensor)
    im = lw.op("add", [times(a, d, "ad"), times(b, c, "bc")], f"{node.name}.im", aten.add.Tensor)
    last = rank(lw, re) - 1
    return lw.op("concat", [re, im], node.name, lambda u, v: aten.cat.default([u, v], -1), axis=last)


def _complex_part(lw: Lowering, x: str, part: int, name: str) -> str:
    """The real (0) or imaginary (1) part of a complex value, keeping the trailing dim (of 1)."""
    shape = lw.shape(x)
    starts, limits = [0] * len(shape), list(shape)
    starts[-1], limits[-1] = part, part + 1
    return lw.op("slice", [x], name, lambda t: aten.slice.Tensor(t, -1, part, part + 1), starts=starts, limits=limits)


@row("masked_fill.Scalar")
def _masked_fill(lw: Lowering, node: Any) -> str:
    """The value where the (broadcast) mask is true, else the input: a select whose second case
    is the value, a scalar input."""
    x, mask, value = lw.tensor(node.args[0]), lw.tensor(node.args[1]), node.args[2]
    if lw.builder.dtype_of(mask) != "bool":
        raise Unsupported("a mask that is not bool")
    fill = lw.scalar(value, x, f"{node.name}.value")
    return lw.op("select", [mask, x, fill], node.name, lambda m, t, _: aten.masked_fill.Scalar(t, m, value))


@row("bitwise_not.default")
def _bitwise_not(lw: Lowering, node: Any) -> str:
    """On bool values (masks), logical not: x == false."""
    x = lw.tensor(node.args[0])
    if lw.builder.dtype_of(x) != "bool":
        raise Unsupported("bitwise not of integers")
    false = lw.scalar(False, x, f"{node.name}.false")
    return lw.op("compare", [x, false], node.name, lambda t, _: aten.bitwise_not.default(t), direction="eq")


@row("gt.Scalar", "lt.Scalar")
def _compare_scalar(lw: Lowering, node: Any) -> str:
    """A comparison with a number of the program (T5's relative position buckets)."""
    x, number = lw.tensor(node.args[0]), node.args[1]
    direction = target_key(node.target).split(".")[0]
    other = lw.scalar(number, x, f"{node.name}.other")
    return lw.op("compare", [x, other], node.name, lambda t, _: node.target(t, number), direction=direction)


@row("min.other")
def _min_other(lw: Lowering, node: Any) -> str:
    a, b = (lw.tensor(t) for t in node.args[:2])
    return lw.op("min", [a, b], node.name, aten.minimum.default)


@row("where.self", "where.ScalarOther", "where.ScalarSelf")
def _where(lw: Lowering, node: Any) -> str:
    """x where the condition holds, else y (either may be a number): a select, whose second case
    is the one a true selector picks."""
    condition, x, y = node.args[:3]
    like = lw.tensor(x) if not isinstance(x, (int, float)) else lw.tensor(y)
    picked = [lw.operand(y, like, f"{node.name}.other"), lw.operand(x, like, f"{node.name}.self")]
    return lw.op("select", [lw.tensor(condition), *picked], node.name,
                 lambda c, otherwise, then: aten.where.self(c, then, otherwise))


@row("full_like.default")
def _full_like(lw: Lowering, node: Any) -> str:
    """The input's shape filled with a number: a scalar input broadcast."""
    like, number = lw.tensor(node.args[0]), node.args[1]
    if node.kwargs.get("dtype") is not None and dtype_name(node.kwargs["dtype"]) != lw.builder.dtype_of(like):
        raise Unsupported("full_like of another dtype")
    shape = out_shape(node)
    fill = lw.scalar(number, like, f"{node.name}.value")
    return lw.op("broadcast_in_dim", [fill], node.name, lambda v: aten.expand.default(v, shape), shape=shape,
                 broadcast_dimensions=[])


@row("zeros.default")
def _zeros(lw: Lowering, node: Any) -> str:
    shape, dtype = out_shape(node), dtype_name(node.meta["val"].dtype)
    zero = lw.scalar(0, "", f"{node.name}.zero", dtype=dtype)
    return lw.op("broadcast_in_dim", [zero], node.name, lambda z: aten.expand.default(z, shape), shape=shape,
                 broadcast_dimensions=[])


@row("arange.default", "arange.start", "arange.start_step")
def _arange(lw: Lowering, node: Any) -> str:
    """start + step * index along the one dim: an iota, scaled and shifted where the numbers ask."""
    numbers = [a for a in node.args if isinstance(a, (int, float)) and not isinstance(a, bool)]
    if len(numbers) != len(node.args):
        raise Unsupported("arange of a traced bound")
    start, step = (numbers[0] if len(numbers) > 1 else 0), (numbers[2] if len(numbers) > 2 else 1)
    shape, dtype = out_shape(node), node.meta["val"].dtype
    values = lw.op("iota", [], node.name if (start, step) == (0, 1) else f"{node.name}.index",
                   lambda: torch.arange(shape[0], dtype=dtype), shape=shape, dimension=0, dtype=dtype_name(dtype))
    if step != 1:
        values = lw.op("mul", [values, lw.scalar(step, values, f"{node.name}.step")],
                       node.name if start == 0 else f"{node.name}.scaled", aten.mul.Tensor)
    if start != 0:
        values = lw.op("add", [values, lw.scalar(start, values, f"{node.name}.start")], node.name, aten.add.Tensor)
    return values


@row("pow.Tensor_Scalar")
def _pow(lw: Lowering, node: Any) -> str:
    x, exponent = lw.tensor(node.args[0]), node.args[1]
    if exponent == 2:
        return lw.op("square", [x], node.name, lambda t: aten.pow.Tensor_Scalar(t, 2))
    if exponent == 0.5:
        return lw.op("sqrt", [x], node.name, lambda t: aten.pow.Tensor_Scalar(t, 0.5))
    return lw.op("pow", [x, lw.scalar(exponent, x, f"{node.name}.exponent")], node.name, aten.pow.Tensor_Tensor)


# --- reductions and normalisations ---------------------------------------------------------
def _reduction(kind: str, all_dims: bool = False) -> Row:
    def lower(lw: Lowering, node: Any) -> str:
        x = lw.tensor(node.args[0])
        if all_dims:
            dims, keep = list(range(rank(lw, x))), False
        else:
            dims = arg(node, 1, "dim")
            dims = list(range(rank(lw, x))) if dims is None else ([dims] if isinstance(dims, int) else list(dims))
            keep = bool(arg(node, 2, "keepdim", False))
        if node.kwargs.get("dtype") is not None:
            raise Unsupported("a reduction that casts")
        rest, kwargs = node.args[1:], dict(node.kwargs)
        return lw.op(kind, [x], node.name, lambda t: node.target(t, *rest, **kwargs), dims=dims, keepdims=keep)
    return lower


row("sum.dim_IntList")(_reduction("reduce_sum"))
row("sum.default")(_reduction("reduce_sum", all_dims=True))
row("mean.dim")(_reduction("reduce_mean"))  # the op table divides by the global count
row("mean.default")(_reduction("reduce_mean", all_dims=True))
row("amax.default")(_reduction("reduce_max"))
row("amin.default")(_reduction("reduce_min"))


@row("_softmax.default", "softmax.int")
def _softmax(lw: Lowering, node: Any) -> str:
    x, dim = lw.tensor(node.args[0]), node.args[1]
    rest = node.args[1:]
    return lw.op("softmax", [x], node.name, lambda t: node.target(t, *rest), axis=dim)


def _last_dim_only(normalized_shape: Sequence[int]) -> None:
    if len(normalized_shape) != 1:
        raise Unsupported("normalisation over several dims")


@row("layer_norm.default")
def _layer_norm(lw: Lowering, node: Any) -> str:
    x, shape = lw.tensor(node.args[0]), arg(node, 1, "normalized_shape")
    _last_dim_only(shape)
    weight, bias, eps = arg(node, 2, "weight"), arg(node, 3, "bias"), arg(node, 4, "eps", 1e-5)
    if weight is None and bias is not None:
        raise Unsupported("layer_norm with a bias but no weight")
    params = [lw.tensor(p) for p in (weight, bias) if p is not None]
    return lw.op("layer_norm", [x, *params], node.name,
                 lambda t, *p: aten.layer_norm.default(t, shape, *p, eps=eps), axis=-1, eps=float(eps))


@row("rms_norm.default")
def _rms_norm(lw: Lowering, node: Any) -> str:
    x, shape = lw.tensor(node.args[0]), arg(node, 1, "normalized_shape")
    _last_dim_only(shape)
    weight, eps = arg(node, 2, "weight"), arg(node, 3, "eps")
    if eps is None:  # torch's default: the machine epsilon of the input's dtype
        eps = torch.finfo(node.args[0].meta["val"].dtype).eps
    params = [lw.tensor(weight)] if weight is not None else []
    return lw.op("rms_norm", [x, *params], node.name,
                 lambda t, *p: aten.rms_norm.default(t, shape, *p, eps=eps), axis=-1, eps=float(eps))


# --- views and data movement ---------------------------------------------------------------
@row("view.default", "reshape.default", "_unsafe_view.default", "unsqueeze.default", "squeeze.dim", "squeeze.dims",
     "squeeze.default", "flatten.using_ints", "unflatten.int")
def _reshape(lw: Lowering, node: Any) -> str:
    # run as `reshape`: after functionalisation a `view` may read a transposed (non-contiguous)
    # value, which only reshape takes whatever its layout
    shape = out_shape(node)
    return lw.op("reshape", [lw.tensor(node.args[0])], node.name, lambda t: aten.reshape.default(t, shape), shape=shape)


@row("transpose.int", "permute.default", "t.default")
def _transpose(lw: Lowering, node: Any) -> str:
    x = lw.tensor(node.args[0])
    r = rank(lw, x)
    key = target_key(node.target)
    if key == "permute.default":
        perm = [d % r for d in node.args[1]]
    else:
        d0, d1 = (node.args[1] % r, node.args[2] % r) if key == "transpose.int" else (0, 1 % max(r, 1))
        perm = list(range(r))
        perm[d0], perm[d1] = perm[d1], perm[d0]
    rest = node.args[1:]
    return lw.op("transpose", [x], node.name, lambda t: node.target(t, *rest), perm=perm)


@row("expand.default")
def _expand(lw: Lowering, node: Any) -> str:
    """A broadcast (no copy in PyTorch): input dims align with the trailing output dims."""
    x = lw.tensor(node.args[0])
    shape = out_shape(node)
    sizes = node.args[1]
    return lw.op("broadcast_in_dim", [x], node.name, lambda t: aten.expand.default(t, sizes), shape=shape,
                 broadcast_dimensions=list(range(len(shape) - rank(lw, x), len(shape))))


@row("slice.Tensor")
def _slice(lw: Lowering, node: Any) -> str:
    x = lw.tensor(node.args[0])
    shape = lw.shape(x)
    dim = arg(node, 1, "dim", 0) % len(shape)
    start, end, step = arg(node, 2, "start"), arg(node, 3, "end"), arg(node, 4, "step", 1)
    start, end, _ = slice(start, end, step).indices(shape[dim])
    if (start, end, step) == (0, shape[dim], 1):
        return x
    starts, limits, strides = [0] * len(shape), list(shape), [1] * len(shape)
    starts[dim], limits[dim], strides[dim] = start, end, step
    return lw.op("slice", [x], node.name, lambda t: aten.slice.Tensor(t, dim, start, end, step),
                 starts=starts, limits=limits, strides=strides)


@row("select.int")
def _select(lw: Lowering, node: Any) -> str:
    """Entry `index` of dim `dim`: a slice of width 1 there (`<node>.slice`), the dim then dropped."""
    x = lw.tensor(node.args[0])
    shape = lw.shape(x)
    dim = node.args[1] % len(shape)
    index = node.args[2] % shape[dim]
    starts, limits = [0] * len(shape), list(shape)
    starts[dim], limits[dim] = index, index + 1
    y = lw.op("slice", [x], f"{node.name}.slice", lambda t: aten.slice.Tensor(t, dim, index, index + 1),
              starts=starts, limits=limits)
    out = out_shape(node)
    return lw.op("reshape", [y], node.name, lambda t: aten.reshape.default(t, out), shape=out)


@row("index.Tensor")
def _index(lw: Lowering, node: Any) -> str:
    """`x[..., [i, i + s, ...], ...]` with one index, a constant of evenly spaced ascending
    positions (Falcon's `qkv[:, :, [-2]]`): a strided slice of that dim. Indices computed by the
    program pick data-dependent positions, which no row of the op table reads."""
    x, indices = lw.tensor(node.args[0]), node.args[1]
    given = [(dim, index) for dim, index in enumerate(indices) if index is not None]
    if len(given) != 1:
        raise Unsupported("indexing by several index tensors")
    (dim, index), = given
    constant = lw.constants.get(lw.tensor(index))
    if constant is None or constant.dim() != 1 or constant.dtype not in (torch.int64, torch.int32) or not len(constant):
        raise Unsupported("an index that is not a constant list of positions")
    size = lw.shape(x)[dim]
    positions = [int(p) % size for p in constant.tolist()]
    step = positions[1] - positions[0] if len(positions) > 1 else 1
    if step < 1 or positions != list(range(positions[0], positions[-1] + 1, step)):
        raise Unsupported(f"positions {positions} are not evenly spaced and ascending")
    shape = lw.shape(x)
    starts, limits, strides = [0] * len(shape), list(shape), [1] * len(shape)
    starts[dim], limits[dim], strides[dim] = positions[0], positions[-1] + 1, step
    start, end = positions[0], positions[-1] + 1
    return lw.op("slice", [x], node.name, lambda t: aten.slice.Tensor(t, dim, start, end, step),
                 starts=starts, limits=limits, strides=strides)


@row("split.Tensor", "split_with_sizes.default")
def _split(lw: Lowering, node: Any) -> str:
    """Each piece is a slice, named `<node>.<i>`; `getitem` picks one."""
    x = lw.tensor(node.args[0])
    shape = lw.shape(x)
    dim = arg(node, 2, "dim", 0) % len(shape)
    sizes = arg(node, 1, "split_size")
    if isinstance(sizes, int):
        sizes = [min(sizes, shape[dim] - s) for s in range(0, shape[dim], sizes)]
    start = 0
    for i, size in enumerate(sizes):
        if size == 0:
            continue  # an empty piece: its `getitem` is an empty value
        starts, limits = [0] * len(shape), list(shape)
        starts[dim], limits[dim] = start, start + size
        lw.values[f"{node.name}#{i}"] = lw.op(
            "slice", [x], f"{node.name}.{i}", lambda t, a=start, b=start + size: aten.slice.Tensor(t, dim, a, b),
            starts=starts, limits=limits)
        start += size
    return x  # the tuple itself is never a tensor; its pieces are


@row("topk.default")
def _topk(lw: Lowering, node: Any) -> str:
    """Values and indices are two ops, `<node>.values` and `<node>.indices`; `getitem` picks one.
    The k largest of the last dim, largest first: one exact answer (ties aside)."""
    x = lw.tensor(node.args[0])
    k, dim = node.args[1], arg(node, 2, "dim", -1)
    # unsorted asks for the k largest in any order: largest first is one of them
    if dim % rank(lw, x) != rank(lw, x) - 1 or not arg(node, 3, "largest", True):
        raise Unsupported("topk of another dim than the last, or of the smallest")
    for i, kind in enumerate(("top_k_values", "top_k_indices")):
        lw.values[f"{node.name}#{i}"] = lw.op(kind, [x], f"{node.name}.{kind.removeprefix('top_k_')}",
                                              lambda t, i=i: aten.topk.default(t, k, -1)[i], k=k)
    return x  # the pair itself is never a tensor; its items are


@row("getitem")
def _getitem(lw: Lowering, node: Any) -> str:
    source, index = node.args
    key = f"{source.name}#{index}"
    if key not in lw.values:
        raise Unsupported(f"item {index} of {source.name}")
    return lw.values[key]


@row("cat.default")
def _cat(lw: Lowering, node: Any) -> str:
    """Empty pieces add nothing and are left out; one piece left is the value itself."""
    inputs = [lw.tensor(t) for t in node.args[0] if t.name not in lw.empty]
    if len(inputs) == 1:
        return inputs[0]
    dim = arg(node, 1, "dim", 0)
    return lw.op("concat", inputs, node.name, lambda *ts: aten.cat.default(list(ts), dim), axis=dim % rank(lw, inputs[0]))


@row("stack.default")
def _stack(lw: Lowering, node: Any) -> str:
    """Each piece given a dim of 1 at `dim` (`<node>.<i>`), then concatenated along it."""
    pieces = [lw.tensor(t) for t in node.args[0]]
    shape = out_shape(node)
    dim = arg(node, 1, "dim", 0) % len(shape)
    one = shape[:dim] + [1] + shape[dim + 1:]
    pieces = [lw.op("reshape", [t], f"{node.name}.{i}", lambda a: aten.reshape.default(a, one), shape=one)
              for i, t in enumerate(pieces)]
    if len(pieces) == 1:
        return pieces[0]
    return lw.op("concat", pieces, node.name, lambda *ts: aten.cat.default(list(ts), dim), axis=dim)


@row("repeat_interleave.self_int")
def _repeat_interleave(lw: Lowering, node: Any) -> str:
    """Each entry along `dim` repeated r times in place: [.., n, ..] -> [.., n, r, ..] (a
    broadcast of a dim of 1) -> [.., n * r, ..]."""
    x = lw.tensor(node.args[0])
    repeats, dim = node.args[1], arg(node, 2, "dim")
    if dim is None:
        raise Unsupported("repeat_interleave of the flattened value")
    shape = list(lw.shape(x))
    dim %= len(shape)
    one = shape[:dim + 1] + [1] + shape[dim + 1:]
    wide = shape[:dim + 1] + [repeats] + shape[dim + 1:]
    y = lw.op("reshape", [x], f"{node.name}.split", lambda a: aten.reshape.default(a, one), shape=one)
    y = lw.op("broadcast_in_dim", [y], f"{node.name}.expand", lambda a: aten.expand.default(a, wide), shape=wide,
              broadcast_dimensions=list(range(len(wide))))
    shape = out_shape(node)
    return lw.op("reshape", [y], node.name, lambda a: aten.reshape.default(a, shape), shape=shape)


@row("new_empty.default")
def _new_empty(lw: Lowering, node: Any) -> str:
    """A value of unspecified contents, which the program overwrites (`slice_scatter`): zeros, a
    scalar input broadcast, so that the graph computes one deterministic value."""
    return _zeros_like_input(lw, node, "new_empty", 0.0)


@row("copy.default")
def _copy(lw: Lowering, node: Any) -> str:
    """Functionalised `dst.copy_(src)`: the value is src's, in dst's shape and dtype."""
    dst, src = lw.tensor(node.args[0]), lw.tensor(node.args[1])
    if lw.shape(dst) != lw.shape(src):
        raise Unsupported("a copy that broadcasts")
    if lw.builder.dtype_of(dst) != lw.builder.dtype_of(src):
        target = node.meta["val"].dtype
        return lw.op("cast", [src], node.name, lambda t: aten._to_copy.default(t, dtype=target),
                     dtype=dtype_name(target))
    return src


@row("slice_scatter.default")
def _slice_scatter(lw: Lowering, node: Any) -> str:
    """src written over positions [start, end) of dim `dim` of the input: the input's slices
    before and after them (`<node>.before`, `<node>.after`) concatenated around src."""
    x, src = lw.tensor(node.args[0]), lw.tensor(node.args[1])
    shape = lw.shape(x)
    dim = arg(node, 2, "dim", 0) % len(shape)
    start, end, step = slice(arg(node, 3, "start"), arg(node, 4, "end"), arg(node, 5, "step", 1)).indices(shape[dim])
    if step != 1:
        raise Unsupported("slice_scatter with a step")
    pieces = []
    for part, a, b in (("before", 0, start), ("src", start, end), ("after", end, shape[dim])):
        if part == "src":
            pieces.append(src)
        elif b > a:
            starts, limits = [0] * len(shape), list(shape)
            starts[dim], limits[dim] = a, b
            pieces.append(lw.op("slice", [x], f"{node.name}.{part}",
                                lambda t, a=a, b=b: aten.slice.Tensor(t, dim, a, b), starts=starts, limits=limits))
    if len(pieces) == 1:
        return src
    return lw.op("concat", pieces, node.name, lambda *ts: aten.cat.default(list(ts), dim), axis=dim)


@row("zeros_like.default")
def _zeros_like(lw: Lowering, node: Any) -> str:
    """Zeros of the input's shape: a scalar input broadcast (the graph format has no constants)."""
    return _zeros_like_input(lw, node, "zeros_like", 0)


def _zeros_like_input(lw: Lowering, node: Any, what: str, zero_value: float) -> str:
    """Zeros of the node's shape in its input's dtype: a scalar input broadcast."""
    like = lw.tensor(node.args[0])
    if node.kwargs.get("dtype") is not None and dtype_name(node.kwargs["dtype"]) != lw.builder.dtype_of(like):
        raise Unsupported(f"{what} of another dtype")
    shape = out_shape(node)
    zero = lw.scalar(zero_value, like, f"{node.name}.zero")
    return lw.op("broadcast_in_dim", [zero], node.name, lambda z: aten.expand.default(z, shape), shape=shape,
                 broadcast_dimensions=[])


def _last_dim_ids(lw: Lowering, node: Any, x: str, ids: str) -> int:
    """The classes of a gather or scatter along the last dim, whose ids have the input's other dims."""
    r = rank(lw, x)
    if node.args[1] % r != r - 1 or rank(lw, ids) != r or lw.shape(ids)[:-1] != lw.shape(x)[:-1]:
        raise Unsupported("a gather or scatter along another dim than the last, or with ids of other leading dims")
    return lw.shape(x)[-1]


@row("gather.default")
def _gather(lw: Lowering, node: Any) -> str:
    """x[..., ids[..., j]] along the last dim (DeepSeek-V3's picked experts' scores): the ids made
    one-hot rows [..., k, C] (`<node>.one_hot`), contracted with x over the classes, so the
    class dim splits into partial sums as a contraction's does."""
    x, ids = lw.tensor(node.args[0]), lw.tensor(node.args[2])
    classes, lead = _last_dim_ids(lw, node, x, ids), rank(lw, x) - 1
    target = node.meta["val"].dtype
    hot = lw.op("one_hot", [ids], f"{node.name}.one_hot",
                lambda i: torch.nn.functional.one_hot(i, classes).to(target),
                num_classes=classes, dtype=lw.builder.dtype_of(x))
    batch = list(range(lead))
    return lw.op("dot_general", [hot, x], node.name, lambda h, t: torch.einsum("...kc,...c->...k", h, t),
                 lhs_batch_dims=batch, rhs_batch_dims=batch, lhs_contracting_dims=[lead + 1],
                 rhs_contracting_dims=[lead])


@row("scatter.value")
def _scatter_value(lw: Lowering, node: Any) -> str:
    """The value written at x[..., ids[..., j]] along the last dim (DeepSeek-V3's mask of picked
    expert groups): whether any id names a class (one-hot rows, their max over the ids), then a
    select of the value there."""
    x, ids, value = lw.tensor(node.args[0]), lw.tensor(node.args[2]), node.args[3]
    classes, lead = _last_dim_ids(lw, node, x, ids), rank(lw, x) - 1
    hot = lw.op("one_hot", [ids], f"{node.name}.one_hot", lambda i: torch.nn.functional.one_hot(i, classes).bool(),
                num_classes=classes, dtype="bool")
    named = lw.op("reduce_max", [hot], f"{node.name}.named", lambda h: aten.any.dim(h, lead), dims=[lead],
                  keepdims=False)
    fill = lw.scalar(value, x, f"{node.name}.value")
    return lw.op("select", [named, x, fill], node.name, lambda m, t, _: aten.masked_fill.Scalar(t, m, value))


@row("embedding.default")
def _embedding(lw: Lowering, node: Any) -> str:
    table, ids = lw.tensor(node.args[0]), lw.tensor(node.args[1])
    rest = node.args[2:]
    return lw.op("embedding", [ids, table], node.name, lambda i, w: aten.embedding.default(w, i, *rest))


# --- attention and convolution ---------------------------------------------------------------
@row("scaled_dot_product_attention.default")
def _sdpa(lw: Lowering, node: Any) -> str:
    """Grouped keys and values (fewer heads than the queries) are broadcast to the query heads,
    as `enable_gqa` does: [B, KV, T, D] -> [B, KV, G, T, D] -> [B, KV * G, T, D]."""
    q, k, v = (lw.tensor(a) for a in node.args[:3])
    mask = arg(node, 3, "attn_mask")
    if arg(node, 4, "dropout_p", 0.0) != 0.0:
        raise Unsupported("attention dropout is random")
    causal, scale = bool(arg(node, 5, "is_causal", False)), node.kwargs.get("scale")
    heads = lw.shape(q)[1]
    k, v = (_repeat_heads(lw, t, heads, f"{node.name}.{role}") for t, role in ((k, "k"), (v, "v")))
    inputs = [q, k, v] + ([lw.tensor(mask)] if mask is not None else [])
    attrs = {"causal": causal} | ({"scale": float(scale)} if scale is not None else {})

    def call(q_: Any, k_: Any, v_: Any, mask_: Any = None) -> Any:
        if q_.device.type != "cpu" or not isinstance(q_, DTensor):
            return aten.scaled_dot_product_attention.default(q_, k_, v_, mask_, 0.0, causal, scale=scale)
        # DTensor has no sharding rule for the fused CPU kernel, so the math form (aten ops it
        # has rules for) runs instead, on contiguous blocks (it views them), with the causal mask
        # as a replicated DTensor of its own (the math form would make a plain tensor of it)
        q_, k_, v_ = (aten.clone.default(t, memory_format=torch.contiguous_format) for t in (q_, k_, v_))
        if causal:
            s, t = q_.shape[-2], k_.shape[-2]
            tril = torch.ones(s, t, dtype=torch.bool).tril()
            tril = DTensor.from_local(tril, q_.device_mesh, [Replicate()] * q_.device_mesh.ndim, run_check=False)
            mask_ = tril if mask_ is None else (aten.logical_and.default(mask_, tril) if mask_.dtype == torch.bool
                                                else aten.masked_fill.Scalar(mask_, aten.logical_not.default(tril), float("-inf")))
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
            return aten.scaled_dot_product_attention.default(q_, k_, v_, mask_, 0.0, False, scale=scale)
    return lw.op("attention", inputs, node.name, call, **attrs)


def _repeat_heads(lw: Lowering, x: str, heads: int, name: str) -> str:
    b, kv, t, d = lw.shape(x)
    if kv == heads:
        return x
    if heads % kv:
        raise Unsupported(f"{heads} query heads are not a multiple of {kv} key/value heads")
    group = heads // kv
    x = lw.op("reshape", [x], f"{name}.split", lambda a: aten.reshape.default(a, [b, kv, 1, t, d]), shape=[b, kv, 1, t, d])
    x = lw.op("broadcast_in_dim", [x], f"{name}.expand", lambda a: aten.expand.default(a, [b, kv, group, t, d]),
              shape=[b, kv, group, t, d], broadcast_dimensions=[0, 1, 2, 3, 4])
    return lw.op("reshape", [x], f"{name}.heads", lambda a: aten.reshape.default(a, [b, heads, t, d]), shape=[b, heads, t, d])


@row("conv2d.default")
def _conv2d(lw: Lowering, node: Any) -> str:
    """NCHW and [F, C, KH, KW] in PyTorch; the op table's conv2d is NHWC with [KH, KW, C, F]."""
    x, w = lw.tensor(node.args[0]), lw.tensor(node.args[1])
    bias = arg(node, 2, "bias")
    stride, padding = _pair(arg(node, 3, "stride", 1)), arg(node, 4, "padding", 0)
    if isinstance(padding, str) or _pair(arg(node, 5, "dilation", 1)) != [1, 1] or arg(node, 6, "groups", 1) != 1:
        raise Unsupported("conv2d with string padding, dilation or groups")
    padding = _pair(padding)
    nhwc = lw.op("transpose", [x], f"{node.name}.input", lambda t: aten.permute.default(t, [0, 2, 3, 1]), perm=[0, 2, 3, 1])
    filt = lw.op("transpose", [w], f"{node.name}.filter", lambda t: aten.permute.default(t, [2, 3, 1, 0]), perm=[2, 3, 1, 0])

    def conv(a: Any, f: Any) -> Any:
        out = aten.conv2d.default(aten.permute.default(a, [0, 3, 1, 2]), aten.permute.default(f, [3, 2, 0, 1]),
                                  None, stride, padding)
        return aten.permute.default(out, [0, 2, 3, 1])
    y = lw.op("conv2d", [nhwc, filt], f"{node.name}.conv", conv, strides=stride,
              padding=[[padding[0], padding[0]], [padding[1], padding[1]]])
    name = f"{node.name}.nchw" if bias is not None else node.name
    y = lw.op("transpose", [y], name, lambda t: aten.permute.default(t, [0, 3, 1, 2]), perm=[0, 3, 1, 2])
    if bias is None:
        return y
    f = lw.shape(lw.tensor(bias))[0]
    b = lw.op("reshape", [lw.tensor(bias)], f"{node.name}.bias", lambda t: aten.reshape.default(t, [f, 1, 1]), shape=[f, 1, 1])
    return lw.op("add", [y, b], node.name, aten.add.Tensor)


@row("conv1d.default")
def _conv1d(lw: Lowering, node: Any) -> str:
    """NCW and [F, C, KW] in PyTorch (Whisper's front end); the op table's conv1d is NWC with
    [KW, C, F]."""
    x, w = lw.tensor(node.args[0]), lw.tensor(node.args[1])
    bias = arg(node, 2, "bias")
    stride, padding = _single(arg(node, 3, "stride", 1)), arg(node, 4, "padding", 0)
    if isinstance(padding, str) or _single(arg(node, 5, "dilation", 1)) != 1 or arg(node, 6, "groups", 1) != 1:
        raise Unsupported("conv1d with string padding, dilation or groups")
    padding = _single(padding)
    nwc = lw.op("transpose", [x], f"{node.name}.input", lambda t: aten.permute.default(t, [0, 2, 1]), perm=[0, 2, 1])
    filt = lw.op("transpose", [w], f"{node.name}.filter", lambda t: aten.permute.default(t, [2, 1, 0]), perm=[2, 1, 0])

    def conv(a: Any, f: Any) -> Any:
        out = aten.conv1d.default(aten.permute.default(a, [0, 2, 1]), aten.permute.default(f, [2, 1, 0]),
                                  None, [stride], [padding])
        return aten.permute.default(out, [0, 2, 1])
    y = lw.op("conv1d", [nwc, filt], f"{node.name}.conv", conv, strides=[stride], padding=[[padding, padding]])
    name = f"{node.name}.ncw" if bias is not None else node.name
    y = lw.op("transpose", [y], name, lambda t: aten.permute.default(t, [0, 2, 1]), perm=[0, 2, 1])
    if bias is None:
        return y
    f = lw.shape(lw.tensor(bias))[0]
    b = lw.op("reshape", [lw.tensor(bias)], f"{node.name}.bias", lambda t: aten.reshape.default(t, [f, 1]), shape=[f, 1])
    return lw.op("add", [y, b], node.name, aten.add.Tensor)


def _single(value: Any) -> int:
    values = [value] if isinstance(value, int) else list(value)
    if len(values) != 1:
        raise Unsupported(f"expected one value, got {value!r}")
    return int(values[0])


def _pair(value: Any) -> list[int]:
    values = [value, value] if isinstance(value, int) else list(value)
    if len(values) != 2:
        raise Unsupported(f"expected two values, got {value!r}")
    return [int(v) for v in values]


# ops that only check or constrain: they have no value
CHECKS = ("_assert_tensor_metadata.default", "_assert_scalar.default", "sym_constrain_range_for_size.default",
          "_assert_async.msg")
