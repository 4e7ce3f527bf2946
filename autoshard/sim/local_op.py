"""Run one op of a partitioned program on every device of the mesh.

A device computes the block of the op's iteration space its option gives it: every split loop
is cut into the reference's ceildiv pieces and the device takes the piece of its in-group
index over that loop's axes. Each operand is cut to the range the block reads through its map,
taken from the device's own shard of that operand (its halos included); a device that does not hold the range is a
bug of the program, reported with the op, operand and device. Where a reduction loop is split
the results are partial; a device whose block is empty contributes the reduction's identity.
An attention op or gradient with its key loop split combines its blocks over those axes
(`sim.attention`); an attention realised as a ring passes its K/V blocks around
(`sim.ring_attention`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from autoshard.affine import AffineMap
from autoshard.dtypes import DTYPES
from autoshard.errors import AutoshardError
from autoshard.graph.model import Op
from autoshard.mesh import Device, Mesh
from autoshard.ops import Block, evaluate_block
from autoshard.ops.loops import LoopNest
from autoshard.planning.options import ShardingOption
from autoshard.reductions import REDUCTIONS
from autoshard.sharding import Sharding, ceildiv
from autoshard.sim.attention import combine_key_blocks, splits_keys
from autoshard.sim.collectives import Shards
from autoshard.sim.ring_attention import result_block, ring_attention


class ProgramError(AutoshardError):
    """A partitioned program cannot run: a device lacks data an op reads, or holds a shard of
    the wrong shape. The message names the op (or value) and the device; so do `op`, `device`."""

    def __init__(self, message: str, op: str = "", device: Device | None = None):
        super().__init__(message)
        self.op = op
        self.device = device


@dataclass(frozen=True, slots=True)
class Placed:
    """A value on the mesh: each device's local tensor, the sharding they form, the global shape."""

    shards: Shards
    sharding: Sharding
    shape: tuple[int, ...]


def loop_block(mesh: Mesh, nest: LoopNest, option: ShardingOption, device: Device) -> Block:
    """The device's block: per split loop the ceildiv piece of its in-group index."""
    starts, sizes = [], []
    for extent, axes in zip(nest.extents, option.loop_axes):
        step = ceildiv(extent, mesh.group_size(axes))
        start = min(mesh.in_group_linear(device, axes) * step, extent)
        starts.append(start)
        sizes.append(min(start + step, extent) - start)
    return Block(tuple(starts), tuple(sizes), nest.extents)


def _span(s: slice) -> str:
    return f"[{s.start}, {s.stop})"


def _describe(slices: Sequence[slice]) -> str:
    return "[" + ", ".join(_span(s) for s in slices) + "]"


def cut_operand(op: Op, index: int, value: Placed, mesh: Mesh, device: Device, block: Block) -> np.ndarray:
    """The part of the device's shard of input `index` that the block reads."""
    needed = op.nest.operand_range(op.nest.input_maps[index], block, value.shape)
    # A halo shard holds its neighbours' cells too; what a window reads past the tensor's edge is
    # the op's padding, added by `evaluate_block`, whatever the halo's padding cells hold.
    held = tuple(slice(a, b) for a, b in value.sharding.device_box(mesh, value.shape, device))
    local = value.shards.get(device)
    if local is None:
        raise ProgramError(f"op {op.name!r} on device {list(device)}: input {index} ({op.inputs[index]!r}) "
                           f"has no defined value on this device", op.name, device)
    if any(n.start < h.start or n.stop > h.stop for n, h in zip(needed, held) if n.stop > n.start):
        raise ProgramError(f"op {op.name!r} on device {list(device)} reads {_describe(needed)} of input {index} "
                           f"({op.inputs[index]!r}) but the device holds {_describe(held)} "
                           f"(sharding {value.sharding})", op.name, device)
    expected = tuple(h.stop - h.start for h in held)
    if local.shape != expected:
        raise ProgramError(f"op {op.name!r} on device {list(device)}: input {index} ({op.inputs[index]!r}) has local "
                           f"shape {list(local.shape)}; sharding {value.sharding} of {list(value.shape)} gives "
                           f"{list(expected)}", op.name, device)
    return local[tuple(slice(n.start - h.start, max(n.stop, n.start) - h.start) for n, h in zip(needed, held))]


def run_local_op(mesh: Mesh, op: Op, option: ShardingOption, inputs: Sequence[Placed],
                 outputs: Sequence[tuple[Sharding, tuple[int, ...], str]]) -> list[Shards]:
    """Every device's local results of `op` under `option`.

    `outputs` gives each result's sharding, global shape and dtype name; each device's result
    must be exactly its shard of that sharding (else ProgramError).
    """
    nest = op.nest
    dtypes = [np.dtype(DTYPES[dtype].numpy) for _, _, dtype in outputs]
    results: list[Shards] = [{} for _ in outputs]
    blocks = {device: loop_block(mesh, nest, option, device) for device in mesh.devices()}
    if option.ring is not None:
        cuts: dict[Device, list[np.ndarray]] = {}
        combined = ring_attention(mesh, op, option, blocks, [inputs[1].shards, inputs[2].shards],
                                  lambda i, device, block: cut_operand(op, i, inputs[i], mesh, device, block))
    else:
        cuts = {device: [cut_operand(op, i, value, mesh, device, block) for i, value in enumerate(inputs)]
                for device, block in blocks.items() if 0 not in block.sizes}
        combined = combine_key_blocks(mesh, op, option, blocks, cuts, dtypes[0]) if splits_keys(op, option) else {}
    for device, block in blocks.items():
        if device in combined:
            values = [combined[device]]
        elif 0 in block.sizes:
            # Nothing to compute: an empty shard, or the identity where only a reduction loop is empty.
            values = [np.full(tuple(r.stop - r.start for r in _written(m, block)),
                              REDUCTIONS[nest.reduction_kind].identity(dt), dt)
                      for m, dt in zip(nest.output_maps, dtypes)]
        else:
            values = evaluate_block(op.op_kind, nest, op.attrs, cuts[device], block)
        for k, (value, (sharding, shape, _), dt) in enumerate(zip(values, outputs, dtypes)):
            value = np.asarray(value).astype(dt, copy=False)
            checked = result_block(mesh, op, option, block, device, k, sharding)
            _check_result(op, k, value, nest, checked, sharding, shape, mesh, device)
            results[k][device] = value
    return results


def _written(map_: AffineMap, block: Block) -> tuple[slice, ...]:
    """The global range of a result that `block` writes through `map_` (result maps have
    non-negative coefficients); empty along dims that an empty loop indexes."""
    ranges = []
    for expr in map_.results:
        first = expr.evaluate(block.starts)
        if any(block.sizes[l] == 0 for l in expr.loops):
            ranges.append(slice(first, first))
        else:
            ranges.append(slice(first, expr.range_over(block.starts, block.sizes)[1] + 1))
    return tuple(ranges)


def _check_result(op: Op, index: int, value: np.ndarray, nest: LoopNest, block: Block, sharding: Sharding,
                  shape: tuple[int, ...], mesh: Mesh, device: Device) -> None:
    held = sharding.device_slices(mesh, shape, device)
    computed = _written(nest.output_maps[index], block)
    if (value.shape != tuple(h.stop - h.start for h in held)
            or any(c.start != h.start for c, h in zip(computed, held) if h.stop > h.start)):
        raise ProgramError(f"op {op.name!r} on device {list(device)} computes {_describe(computed)} of result "
                           f"{index} ({op.outputs[index]!r}), but sharding {sharding} of {list(shape)} puts "
                           f"{_describe(held)} there", op.name, device)
