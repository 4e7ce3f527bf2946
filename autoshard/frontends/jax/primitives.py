"""The jax primitives autoshard reads: one row per primitive, saying which graph ops of the op
table (`autoshard.ops`) it becomes.

A row is a function of an `Emit` (which adds ops to the graph being built and names the tensors
of the equation's operands) and the equation; it returns the graph tensor of each result. A
primitive without a row, or an equation its row cannot express (`Unsupported`, or an op the op
table refuses), becomes an `opaque` op, kept whole on every device.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from autoshard.frontends.jax.convolution import conv_general_dilated
from autoshard.frontends.jax.indexing import gather, scatter
from autoshard.frontends.jax.rows import Emit, Row, Unsupported
from autoshard.frontends.jax.trace import Const, FlatEqn


# jax element types -> the graph's (`autoshard.dtypes`)
DTYPE_NAMES = {"float64": "f64", "float32": "f32", "bfloat16": "bf16", "float16": "f16", "float8_e4m3fn": "f8",
               "int64": "i64", "int32": "i32", "uint32": "i32", "bool": "bool"}


def _same(e: Emit, eqn: FlatEqn) -> list[str]:
    """The results are the operands (no data changes hands)."""
    return [e.tensor(a) for a in eqn.inputs]


def _elementwise(kind: str) -> Row:
    return lambda e, eqn: [e.op(kind, [e.tensor(a) for a in eqn.inputs])]


def _integer_pow(e: Emit, eqn: FlatEqn) -> list[str]:
    y, x = eqn.params["y"], eqn.inputs[0]
    if y == 1:
        return _same(e, eqn)
    if y == 2:
        return [e.op("square", [e.tensor(x)])]
    return [e.op("pow", [e.tensor(x), e.constant(y, e.dtype(x))])]


def _convert(e: Emit, eqn: FlatEqn) -> list[str]:
    target = DTYPE_NAMES.get(str(np.dtype(eqn.params["new_dtype"])))
    if target is None:
        raise Unsupported(f"new_dtype {eqn.params['new_dtype']} has no graph dtype")
    if target == e.dtype(eqn.inputs[0]):
        return _same(e, eqn)
    return [e.op("cast", [e.tensor(eqn.inputs[0])], dtype=target)]


def _reduce(kind: str) -> Row:
    return lambda e, eqn: [e.op(kind, [e.tensor(eqn.inputs[0])], dims=[int(a) for a in eqn.params["axes"]])]


def _broadcast(e: Emit, eqn: FlatEqn) -> list[str]:
    return [e.op("broadcast_in_dim", [e.tensor(eqn.inputs[0])], shape=[int(s) for s in eqn.params["shape"]],
                 broadcast_dimensions=[int(d) for d in eqn.params["broadcast_dimensions"]])]


def _reshape_to(shape: Sequence[int]) -> Row:
    def row(e: Emit, eqn: FlatEqn) -> list[str]:
        if tuple(shape) == e.shape(eqn.inputs[0]):
            return _same(e, eqn)
        return [e.op("reshape", [e.tensor(eqn.inputs[0])], shape=[int(s) for s in shape])]
    return row


def _reshape(e: Emit, eqn: FlatEqn) -> list[str]:
    if eqn.params.get("dimensions") is not None:
        raise Unsupported("a reshape that transposes first (dimensions is set)")
    return _reshape_to(eqn.params["new_sizes"])(e, eqn)


def _squeeze(e: Emit, eqn: FlatEqn) -> list[str]:
    dropped = {d % len(e.shape(eqn.inputs[0])) for d in eqn.params["dimensions"]}
    return _reshape_to([s for d, s in enumerate(e.shape(eqn.inputs[0])) if d not in dropped])(e, eqn)


def _transpose(e: Emit, eqn: FlatEqn) -> list[str]:
    return [e.op("transpose", [e.tensor(eqn.inputs[0])], perm=[int(p) for p in eqn.params["permutation"]])]


def _concatenate(e: Emit, eqn: FlatEqn) -> list[str]:
    return [e.op("concat", [e.tensor(a) for a in eqn.inputs], axis=int(eqn.params["dimension"]))]


def _slice(e: Emit, eqn: FlatEqn) -> list[str]:
    shape = e.shape(eqn.inputs[0])
    strides = eqn.params.get("strides") or (1,) * len(shape)
    starts, limits = eqn.params["start_indices"], eqn.params["limit_indices"]
    if all(a == 0 and b == n and s == 1 for a, b, s, n in zip(starts, limits, strides, shape)):
        return _same(e, eqn)
    return [e.op("slice", [e.tensor(eqn.inputs[0])], starts=[int(a) for a in starts], limits=[int(b) for b in limits],
                 strides=[int(s) for s in strides])]


def _split(e: Emit, eqn: FlatEqn) -> list[str]:
    shape, axis = e.shape(eqn.inputs[0]), int(eqn.params["axis"]) % len(e.shape(eqn.inputs[0]))
    starts = np.cumsum([0] + [int(n) for n in eqn.params["sizes"]])
    return [e.op("slice", [e.tensor(eqn.inputs[0])], starts=[int(a) if d == axis else 0 for d in range(len(shape))],
                 limits=[int(b) if d == axis else n for d, n in enumerate(shape)], strides=[1] * len(shape))
            for a, b in zip(starts, starts[1:])]


def _pad(e: Emit, eqn: FlatEqn) -> list[str]:
    x, value = eqn.inputs
    config = [tuple(int(v) for v in dim) for dim in eqn.params["padding_config"]]
    if not isinstance(value, Const) or np.any(value.value != 0):
        raise Unsupported("a padding value other than a constant zero (the op table pads with zeros)")
    if any(low < 0 or high < 0 or interior for low, high, interior in config):
        raise Unsupported(f"padding_config {config} has negative or interior padding")
    if not any(low or high for low, high, _ in config):
        return [e.tensor(x)]
    return [e.op("pad", [e.tensor(x)], low=[c[0] for c in config], high=[c[1] for c in config])]


def _compare(direction: str) -> Row:
    return lambda e, eqn: [e.op("compare", [e.tensor(a) for a in eqn.inputs], direction=direction)]


def _iota(e: Emit, eqn: FlatEqn) -> list[str]:
    return [e.op("iota", [], shape=[int(s) for s in eqn.params["shape"]], dimension=int(eqn.params["dimension"]),
                 dtype=DTYPE_NAMES[str(np.dtype(eqn.params["dtype"]))])]


def _dot_general(e: Emit, eqn: FlatEqn) -> list[str]:
    (lhs_contract, rhs_contract), (lhs_batch, rhs_batch) = eqn.params["dimension_numbers"]
    lhs, rhs = eqn.inputs
    preferred = eqn.params.get("preferred_element_type")
    target = DTYPE_NAMES.get(str(np.dtype(preferred))) if preferred is not None else e.dtype(lhs)
    if target is None:
        raise Unsupported(f"preferred_element_type {preferred} has no graph dtype")
    out = e.op("dot_general", [e.tensor(lhs), e.tensor(rhs)],
               lhs_batch_dims=[int(d) for d in lhs_batch], rhs_batch_dims=[int(d) for d in rhs_batch],
               lhs_contracting_dims=[int(d) for d in lhs_contract], rhs_contracting_dims=[int(d) for d in rhs_contract])
    return [out if target == e.dtype(lhs) else e.op("cast", [out], dtype=target)]


def _cumulative(reduction: str) -> Row:
    return lambda e, eqn: [e.op("cumulative", [e.tensor(eqn.inputs[0])], axis=int(eqn.params["axis"]),
                                reduction=reduction, reverse=bool(eqn.params["reverse"]))]


def _stack(e: Emit, eqn: FlatEqn) -> list[str]:
    axis = int(eqn.params["axis"])
    shape = list(e.shape(eqn.inputs[0]))
    parts = [e.op("reshape", [e.tensor(a)], shape=shape[:axis] + [1] + shape[axis:]) for a in eqn.inputs]
    return [e.op("concat", parts, axis=axis)]


def _top_k(e: Emit, eqn: FlatEqn) -> list[str]:
    x = eqn.inputs[0]
    rank = len(e.shape(x))
    if int(eqn.params.get("axis", rank - 1)) % max(rank, 1) != rank - 1:
        raise Unsupported(f"top_k over axis {eqn.params['axis']} (the op table picks along the last dim)")
    k = int(eqn.params["k"])
    values = e.op("top_k_values", [e.tensor(x)], k=k)
    indices = e.op("top_k_indices", [e.tensor(x)], k=k)  # i64 in the op table
    wanted = e.dtype(eqn.outputs[1])
    return [values, indices if wanted == "i64" else e.op("cast", [indices], dtype=wanted)]


PRIMITIVES: dict[str, Row] = {
    **{name: _elementwise(name) for name in ("neg", "exp", "log", "sqrt", "rsqrt", "tanh", "sin", "cos", "abs", "square",
                                             "add", "sub", "mul", "div", "max", "min", "pow")},
    "logistic": _elementwise("sigmoid"),
    "add_any": _elementwise("add"),  # the sum of two gradient contributions
    "integer_pow": _integer_pow,
    "convert_element_type": _convert,
    "reduce_sum": _reduce("reduce_sum"),
    "reduce_max": _reduce("reduce_max"),
    "reduce_min": _reduce("reduce_min"),
    "broadcast_in_dim": _broadcast,
    "reshape": _reshape,
    "squeeze": _squeeze,
    "transpose": _transpose,
    "concatenate": _concatenate,
    "slice": _slice,
    "split": _split,
    "pad": _pad,
    "select_n": _elementwise("select"),
    **{name: _compare(name) for name in ("eq", "ne", "lt", "le", "gt", "ge")},
    "iota": _iota,
    "dot_general": _dot_general,
    "stack": _stack,
    **{f"cum{name}": _cumulative(reduction) for name, reduction in (("sum", "sum"), ("prod", "product"),
                                                                    ("max", "max"), ("min", "min"))},
    "top_k": _top_k,
    "gather": gather,
    "scatter": scatter,
    "scatter-add": scatter,
    "conv_general_dilated": conv_general_dilated,
    # values passed on unchanged (what they mean lies outside one step's data flow)
    **{name: _same for name in ("stop_gradient", "copy", "copy_p", "reduce_precision", "sharding_constraint",
                                "optimization_barrier")},
}
