"""The op table: one row per op kind.

A row is data plus small functions: how the op's loop nest follows from its input shapes and
attributes, what it computes on a block of its iteration space (numpy), FLOPs, output dtypes.
Result shapes, legal shardings, partial results and local computation are all derived from the
loop nest, so adding an op is one row here and one test graph.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from autoshard.affine import AffineMap
from autoshard.dtypes import DTYPES
from autoshard.ops.loops import Block, LoopNest, map_extent
from autoshard.reductions import REDUCTIONS

Shape = tuple[int, ...]
Attrs = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class OpDecl:
    """One op of a graph being built: a kind of this table applied to named tensors."""

    name: str
    kind: str
    inputs: tuple[str, ...]
    output: str
    attrs: Mapping[str, Any]


class OpError(ValueError):
    """An op's inputs or attributes do not fit its kind; `field` names the attribute if any."""

    def __init__(self, message: str, field: str = ""):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True, slots=True)
class Context:
    """What a compute function may know about the block it evaluates."""

    nest: LoopNest
    block: Block
    attrs: Attrs
    out_shapes: tuple[Shape, ...]


def _flops_per_point(k: float) -> Callable[[LoopNest, Attrs], float]:
    return lambda nest, attrs: k * nest.points()


def largest_block_share(nest: LoopNest, attrs: Attrs, splits: Sequence[int]) -> float:
    """The share of an op's FLOPs the device with the largest block computes when loop i is cut
    into splits[i] contiguous blocks (ceildiv, the last may be short), for work even over the
    points: the largest block's points over all."""
    return math.prod(-(-e // n) for e, n in zip(nest.extents, splits)) / max(nest.points(), 1)


def _same_dtype(in_dtypes: Sequence[str], attrs: Attrs) -> tuple[str, ...]:
    return (in_dtypes[0],)


def accumulated_dtype(in_dtypes: Sequence[str], attrs: Attrs) -> tuple[str, ...]:
    """The result of a contraction or reduction: in its operands' dtype, or in the float its
    attribute `dtype` names (it accumulates and writes there, as XLA's preferred_element_type: a
    bf16 weight gradient written in f32, so its sum across data replicas is an f32 one)."""
    target = attrs.get("dtype")
    if target is None:
        return (in_dtypes[0],)
    floats = sorted(name for name, info in DTYPES.items() if info.is_float)
    if target not in floats or not DTYPES[in_dtypes[0]].is_float:
        raise OpError(f"attribute 'dtype' must be one of {floats} on float operands, got {target!r} on "
                      f"{in_dtypes[0]}", "dtype")
    return (target,)


def in_accumulated_dtype(compute: Callable[[list[np.ndarray], "Context"], list[np.ndarray]]
                         ) -> Callable[[list[np.ndarray], "Context"], list[np.ndarray]]:
    """`compute` with its results in attribute `dtype` when the op names one (`accumulated_dtype`)."""
    def typed(inputs: list[np.ndarray], ctx: Context) -> list[np.ndarray]:
        results = compute(inputs, ctx)
        target = ctx.attrs.get("dtype")
        return results if target is None else [r.astype(DTYPES[target].numpy, copy=False) for r in results]
    return typed


@dataclass(frozen=True)
class OpKind:
    name: str
    num_inputs: tuple[int, int | None]  # least and most inputs (None: any number)
    loops: Callable[[Sequence[Shape], Attrs], LoopNest]
    compute: Callable[[list[np.ndarray], Context], list[np.ndarray]]
    flops: Callable[[LoopNest, Attrs], float] = field(default=_flops_per_point(1.0))
    out_dtypes: Callable[[Sequence[str], Attrs], tuple[str | None, ...]] = field(default=_same_dtype)  # None: as declared
    attrs: tuple[str, ...] = ()  # attribute names the kind accepts
    # Scalar body for emitting `linalg.generic` (a payload name), when the op has one.
    payload: str | None = None
    # True when `loops` takes the declared output shapes after the input shapes (generic ops,
    # whose loop extents may only be fixed by the output).
    reads_output_shapes: bool = False
    # True when the result is a view of input 0 (its storage, read through other strides: torch's
    # `expand` and `view`): it holds no memory of its own, and input 0 stays held while it is.
    view: bool = False
    # The reduction kind whose identity cells outside an input read as (a window's padding), or
    # None for ops whose maps never reach outside their inputs.
    window_fill: Callable[[Attrs], str | None] = field(default=lambda attrs: None)
    # True when the op computes on floating-point values only (its first input must be a float).
    float_only: bool = False
    # The share of the FLOPs the busiest device computes, given each loop's number of blocks: an
    # op whose work is uneven over its points (causal attention) says where it is largest.
    block_share: Callable[[LoopNest, Attrs, Sequence[int]], float] = field(default=largest_block_share)
    doc: str = ""

    def payload_of(self, attrs: Attrs) -> str | None:
        """The payload an op of this kind computes: a `generic` op names its own in attribute
        `payload`, other kinds have the row's."""
        return attrs.get("payload") or self.payload


OP_KINDS: dict[str, OpKind] = {}


def register(kind: OpKind) -> OpKind:
    assert kind.name not in OP_KINDS, kind.name
    OP_KINDS[kind.name] = kind
    return kind


def evaluate_block(kind: OpKind, nest: LoopNest, attrs: Attrs, inputs: Sequence[np.ndarray],
                   block: Block) -> list[np.ndarray]:
    """Run the op on `block`, given each input already cut to the range the block reads.

    With reduction loops only partly covered, the results are partial: combining the blocks'
    results with the op's reduction kind gives the whole op's results.
    """
    out_shapes = tuple(map_extent(m, block.sizes) for m in nest.output_maps)
    fill = kind.window_fill(attrs)
    if fill is not None:
        inputs = [_pad_to_reach(x, m, block, REDUCTIONS[fill].identity(x.dtype)) for x, m in zip(inputs, nest.input_maps)]
    return kind.compute(list(inputs), Context(nest, block, attrs, out_shapes))


def _pad_to_reach(x: np.ndarray, map_: AffineMap, block: Block, value: Any) -> np.ndarray:
    """`x`, cut to the part of the input inside the tensor, grown with `value` to the whole range
    the block reads (windows reach past the edges by their padding)."""
    widths = []
    for expr, held in zip(map_.results, x.shape):
        low, high = expr.range_over(block.starts, block.sizes)
        before = max(0, -low)
        widths.append((before, max(0, high - low + 1 - before - held)))
    return np.pad(x, widths, constant_values=value) if any(a or b for a, b in widths) else x


def evaluate(kind: OpKind, nest: LoopNest, attrs: Attrs, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Run the whole op on full inputs."""
    block = Block.whole(nest.extents)
    cut = [x[nest.operand_range(m, block, x.shape)] for x, m in zip(inputs, nest.input_maps)]
    return evaluate_block(kind, nest, attrs, cut, block)


def shape_error(expected: str, shapes: Sequence[Shape]) -> OpError:
    return OpError(f"expected {expected}, got input shapes {[list(s) for s in shapes]}")


def int_attr(attrs: Attrs, name: str, default: int | None = None) -> int:
    value = attrs.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise OpError(f"attribute {name!r} must be an integer, got {value!r}", name)
    return value


def int_list_attr(attrs: Attrs, name: str, default: Sequence[int] | None = None) -> tuple[int, ...]:
    value = attrs.get(name, default)
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise OpError(f"attribute {name!r} must be a list of integers, got {value!r}", name)
    return tuple(value)


def normalize_dim(dim: int, rank: int, name: str = "axis") -> int:
    if not -rank <= dim < rank:
        raise OpError(f"attribute {name!r} = {dim} is out of range for rank {rank}", name)
    return dim % rank


def prod(values: Sequence[int]) -> int:
    return math.prod(values)
