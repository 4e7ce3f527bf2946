"""The loop nest of an op: extents, iterator types, one indexing map per operand and result.

Everything the sharding machinery needs is derived from this: result shapes, which loops may be
split without changing the result, and which slice of each operand a block of loops reads.
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
        with `k` the product of the minor extents, so each shard stays contiguous).
        """
        return tuple(l for l in range(self.num_loops)
                     if self.iterator_types[l] != INVALID and all(loop_position(m, l, self.extents) is not None
                                                                  for m in self.maps))


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
