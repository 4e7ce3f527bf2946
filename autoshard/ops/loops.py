"""The loop nest of an op: extents, iterator types, one indexing map per operand and result.

Everything the sharding machinery needs is derived from this: result shapes, which loops may be
split without changing the result, and which slice of each operand a block of loops reads.

A window read `d_out * stride + d_kernel - pad` (convolution, pooling) lets `d_out` be split when
the kernel loop stays whole: each block of outputs reads its own block of the input plus a halo
of `pad` cells before it and `kernel - stride - pad` after it (none if negative), the same on
every device when the input block is exactly `stride` output blocks (see `Window.aligned`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from autoshard.affine import AffineExpr, AffineMap

PARALLEL, REDUCTION, INVALID = "parallel", "reduction", "invalid"


@dataclass(frozen=True, slots=True)
class Block:
    """A box of the iteration space: what one device computes, or the whole op."""

    starts: tuple[int, ...]
    sizes: tuple[int, ...]
    extents: tuple[int, ...]  # the op's global loop extents

    @classmethod
    def whole(cls, extents: Sequence[int]) -> "Block":
        return cls(tuple(0 for _ in extents), tuple(extents), tuple(extents))


@dataclass(frozen=True, slots=True)
class LoopNest:
    extents: tuple[int, ...]
    iterator_types: tuple[str, ...]
    input_maps: tuple[AffineMap, ...]
    output_maps: tuple[AffineMap, ...]
    reduction_kind: str = "sum"
    # The inputs' shapes, where a map's reach does not fix them: a window's input may be longer
    # than the windows reach (stride remainder, bottom padding), and its split follows the size.
    input_shapes: tuple[tuple[int, ...], ...] = ()

    @property
    def num_loops(self) -> int:
        return len(self.extents)

    @property
    def maps(self) -> tuple[AffineMap, ...]:
        return self.input_maps + self.output_maps

    @property
    def reduction_loops(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.iterator_types) if t == REDUCTION)

    def output_shapes(self) -> tuple[tuple[int, ...], ...]:
        return tuple(map_extent(m, self.extents) for m in self.output_maps)

    def points(self) -> int:
        return math.prod(self.extents)

    def operand_range(self, map_: AffineMap, block: Block, shape: Sequence[int]) -> tuple[slice, ...]:
        """The slice of a tensor of `shape` that `block` touches through `map_`, clipped to the tensor."""
        slices = []
        for expr, size in zip(map_.results, shape):
            low, high = expr.range_over(block.starts, block.sizes)
            slices.append(slice(max(low, 0), min(high + 1, size)))
        return tuple(slices)

    def splittable_loops(self) -> tuple[int, ...]:
        """Loops whose split keeps every operand and result a block sharding.

        A loop qualifies when it is not `invalid` and, in every map, it is either absent or the
        whole expression of one dim (`d_i`), or the major term of a reshape sum (`d_i * k + ...`
        with `k` the product of the minor extents, so each shard stays contiguous), or, in an
        input map whose input shape is known, the output loop of a window (a halo split).
        """
        return tuple(l for l in range(self.num_loops)
                     if self.iterator_types[l] != INVALID
                     and all(loop_position(m, l, self.extents) is not None or self.window(i, l) is not None
                             for i, m in enumerate(self.maps)))

    def window(self, map_index: int, loop: int) -> "Window | None":
        """The window through which input `map_index` reads along `loop`, or None."""
        if map_index >= min(len(self.input_maps), len(self.input_shapes)):
            return None  # results are written block by block: a window there would overlap
        m, shape = self.input_maps[map_index], self.input_shapes[map_index]
        for dim, expr in enumerate(m.results):
            if loop in expr.loops:
                found = _window_of(expr, loop, self.iterator_types, self.extents)
                if found is None or any(loop in e.loops for e in m.results[dim + 1:]):
                    return None
                stride, kernel, pad = found
                return Window(dim, stride, kernel, pad, shape[dim], self.extents[loop])
        return None

    def windows(self, loop: int) -> tuple["Window", ...]:
        """Every input window along `loop`."""
        found = (self.window(i, loop) for i in range(len(self.input_maps)))
        return tuple(w for w in found if w is not None)


@dataclass(frozen=True, slots=True)
class Window:
    """Input dim `dim` (of `size` cells) read as `d_out * stride + d_kernel - pad`, with `outputs`
    values of `d_out` and `kernel` of `d_kernel`."""

    dim: int
    stride: int
    kernel: int
    pad: int
    size: int
    outputs: int

    @property
    def halo(self) -> tuple[int, int]:
        """Cells a block of outputs reads before and after its own input block."""
        return self.pad, max(0, self.kernel - self.stride - self.pad)

    def aligned(self, ways: int) -> bool:
        """Whether `ways` ceildiv blocks of the outputs read the ceildiv blocks of the input plus
        the same halo on every device: the input block is exactly `stride` output blocks, and
        every shard holds at least the halo its neighbours read from it (the last may be short)."""
        in_block, out_block = -(-self.size // ways), -(-self.outputs // ways)
        if in_block != self.stride * out_block:
            return False
        last = self.size - in_block * (ways - 1)
        return last >= max(self.halo) and in_block >= max(self.halo)


def map_extent(map_: AffineMap, extents: Sequence[int]) -> tuple[int, ...]:
    """Tensor shape a map reaches over the loop box (high - low + 1 per dim)."""
    shape = []
    for expr in map_.results:
        low, high = expr.bounds(extents)
        shape.append(high - low + 1)
    return tuple(shape)


def loop_position(map_: AffineMap, loop: int, extents: Sequence[int]) -> int | None | bool:
    """The tensor dim a split of `loop` splits in this map; -1 if the loop is absent.

    Returns None when splitting the loop would not leave a block sharding of this tensor.
    """
    found: int | None = -1
    for dim, expr in enumerate(map_.results):
        if loop not in expr.loops:
            continue
        if found != -1 or not _is_major_term(expr, loop, extents):
            return None
        found = dim
    return found


def _window_of(expr: AffineExpr, loop: int, iterator_types: Sequence[str],
               extents: Sequence[int]) -> tuple[int, int, int] | None:
    """(stride, kernel extent, pad) when `expr` is `d_loop * stride + d_kernel - pad` with a
    kernel loop that must stay whole (`invalid`), pad >= 0; else None."""
    if len(expr.terms) != 2 or expr.const > 0:
        return None
    coeffs = dict(expr.terms)
    (kernel,) = (l for l in coeffs if l != loop)
    if coeffs[loop] < 1 or coeffs[kernel] != 1 or iterator_types[kernel] != INVALID:
        return None
    return coeffs[loop], extents[kernel], -expr.const


def _is_major_term(expr: AffineExpr, loop: int, extents: Sequence[int]) -> bool:
    if expr.const != 0:
        return False
    coeffs = dict(expr.terms)
    if expr.single_loop() == loop:
        return True
    # d_major * (prod of minor extents) + minor terms that fill exactly the rest, in order.
    ordered = sorted(expr.terms, key=lambda t: -t[1])
    if ordered[0][0] != loop:
        return False
    stride = 1
    for l, c in reversed(ordered):
        if c != stride:
            return False
        stride *= extents[l]
    return coeffs[loop] == stride // extents[loop]
