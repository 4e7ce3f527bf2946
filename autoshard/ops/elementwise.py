"""Elementwise ops: unary payloads, binary payloads with numpy broadcasting, `cast`, `compare` and
`select`."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from autoshard.affine import AffineExpr, AffineMap
from autoshard.dtypes import DTYPES
from autoshard.ops.loops import PARALLEL, LoopNest
from autoshard.ops.payloads import BINARY, PAYLOADS, UNARY
from autoshard.ops.table import Attrs, Context, OpError, OpKind, Shape, register


def broadcast_shape(shapes: Sequence[Shape]) -> Shape:
    rank = max(len(s) for s in shapes)
    out = []
    for dim in range(rank):
        sizes = {s[dim - rank + len(s)] for s in shapes if dim - rank + len(s) >= 0} - {1}
        if len(sizes) > 1:
            raise OpError(f"shapes {[list(s) for s in shapes]} do not broadcast (numpy rules) at dim {dim}")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def broadcast_map(shape: Shape, out: Shape) -> AffineMap:
    """Right-aligned numpy broadcasting: a size-1 dim against a larger one reads index 0."""
    lead = len(out) - len(shape)
    return AffineMap(len(out), tuple(
        AffineExpr.constant(0) if size == 1 and out[lead + i] != 1 else AffineExpr.loop(lead + i)
        for i, size in enumerate(shape)))


def elementwise_loops(shapes: Sequence[Shape], attrs: Attrs) -> LoopNest:
    out = broadcast_shape(shapes)
    return LoopNest(out, (PARALLEL,) * len(out), tuple(broadcast_map(s, out) for s in shapes),
                    (AffineMap.identity(len(out)),))


def _payload_compute(name: str):
    fn = PAYLOADS[name].fn

    def compute(inputs: list[np.ndarray], ctx: Context) -> list[np.ndarray]:
        return [np.asarray(fn(*inputs))]
    return compute


def _unary_loops(shapes: Sequence[Shape], attrs: Attrs) -> LoopNest:
    if len(shapes) != 1:
        raise OpError(f"expected 1 input, got {len(shapes)}")
    return elementwise_loops(shapes, attrs)


for _name in UNARY:
    register(OpKind(_name, (1, 1), _unary_loops, _payload_compute(_name),
                    lambda nest, attrs, _n=_name: PAYLOADS[_n].flops * nest.points(),
                    payload=_name, doc=f"elementwise {_name}"))

for _name in BINARY:
    register(OpKind(_name, (2, 2), elementwise_loops, _payload_compute(_name),
                    lambda nest, attrs, _n=_name: PAYLOADS[_n].flops * nest.points(),
                    payload=_name, doc=f"elementwise {_name} with numpy broadcasting"))


def _cast_dtype(in_dtypes: Sequence[str], attrs: Attrs) -> tuple[str, ...]:
    target = attrs.get("dtype")
    if target not in DTYPES:
        raise OpError(f"attribute 'dtype' must be one of {sorted(DTYPES)}, got {target!r}", "dtype")
    return (target,)


def _cast_compute(inputs: list[np.ndarray], ctx: Context) -> list[np.ndarray]:
    return [inputs[0].astype(DTYPES[ctx.attrs["dtype"]].numpy)]


register(OpKind("cast", (1, 1), _unary_loops, _cast_compute, lambda nest, attrs: 0.0, _cast_dtype,
                attrs=("dtype",), payload="copy", doc="convert to attribute dtype"))


# --- compare and select -----------------------------------------------------------------
COMPARISONS = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
               "ge": np.greater_equal}


def _direction(attrs: Attrs) -> str:
    direction = attrs.get("direction")
    if direction not in COMPARISONS:
        raise OpError(f"attribute 'direction' must be one of {list(COMPARISONS)}, got {direction!r}", "direction")
    return direction


def _compare_loops(shapes: Sequence[Shape], attrs: Attrs) -> LoopNest:
    _direction(attrs)
    return elementwise_loops(shapes, attrs)


def _compare(inputs: list[np.ndarray], ctx: Context) -> list[np.ndarray]:
    return [COMPARISONS[_direction(ctx.attrs)](inputs[0], inputs[1])]


register(OpKind("compare", (2, 2), _compare_loops, _compare, out_dtypes=lambda in_dtypes, attrs: ("bool",),
                attrs=("direction",), doc="elementwise comparison (attribute direction: eq ne lt le gt ge) to bool"))


def _select(inputs: list[np.ndarray], ctx: Context) -> list[np.ndarray]:
    # A bool selector picks the second case where true, an integer one the case it numbers.
    which, cases = inputs[0], inputs[1:]
    return [np.choose(which.astype(np.int64), np.broadcast_arrays(*cases))]


register(OpKind("select", (2, None), elementwise_loops, _select, out_dtypes=lambda in_dtypes, attrs: (in_dtypes[1],),
                doc="elementwise pick among the cases by the first input (XLA select_n), with numpy broadcasting"))
