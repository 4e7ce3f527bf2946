"""Attention realised as a ring over one mesh axis (`planning.ring_attention`), run as the
devices run it.

Each device starts with its query block and its own block of the keys and values along the ring
axis. At step j (of n, the axis size) the device at ring coordinate c holds key block
(c - j) mod n: it computes that block's online-softmax state (`ops.nn.attention_block_state`,
with the causal mask at the global positions of both blocks) and folds it into its running row
maximum, exponent sums and weighted values; then every device passes its K/V block to the next
one (`shift` by one, rotating) and receives the previous one's. After n steps each device has
seen every block and divides. Nothing is gathered and nothing is all-reduced.

A gradient of such an attention walks the ring twice, each pass starting from the device's own
block: first for the row statistics of every key (row maximum, exponent sums and
rowsum(exp(s - M) * dP), folded as the forward folds its state), then for its gradient block at
each step (`ops.grads.attention_grad_block`): dq and a mask's gradient accumulate on the device;
dk's and dv's accumulator travels with its key/value block and takes one more step home, so each
device ends with its own keys' gradient, whole.
"""

from __future__ import annotations

from typing import Callable, Iterator, Mapping, Sequence

import numpy as np

from autoshard.graph.model import Op
from autoshard.mesh import Device, Mesh
from autoshard.ops import Block
from autoshard.ops.grads import attention_grad_block, attention_grad_row_max, attention_grad_sums
from autoshard.ops.loops import loop_position, map_extent
from autoshard.ops.nn import KEY_LOOP, attention_block_state, rescale_block_state
from autoshard.ops.table import Context
from autoshard.planning.options import ShardingOption
from autoshard.sharding import Sharding
from autoshard.sim.collectives import Shards, shift

# (input index, device, block) -> the part of the device's shard of that input the block reads
Cut = Callable[[int, Device, Block], np.ndarray]


def ring_step_block(block: Block, key_block: int, keys_per_block: int) -> Block:
    """The device's block at a ring step: its own loops, the keys of block `key_block`."""
    starts, sizes = list(block.starts), list(block.sizes)
    starts[KEY_LOOP], sizes[KEY_LOOP] = key_block * keys_per_block, keys_per_block
    return Block(tuple(starts), tuple(sizes), block.extents)


def result_block(mesh: Mesh, op: Op, option: ShardingOption, block: Block, device: Device, index: int,
                 sharding: Sharding) -> Block:
    """The block of the op's loops whose range result `index` holds on the device: with its own
    key block where the ring axis splits the result along the keys (a gradient's dk, dv, brought
    home), else the device's block."""
    dim = loop_position(op.nest.output_maps[index], KEY_LOOP, op.nest.extents)
    if option.ring is None or dim is None or dim < 0 or option.ring not in sharding.dim_axes(dim):
        return block
    n = mesh.axis_size(option.ring)
    return ring_step_block(block, device[mesh.axis_index(option.ring)], op.nest.extents[KEY_LOOP] // n)


class _Ring:
    """The K/V blocks each device holds as the ring turns, and the step blocks it computes."""

    def __init__(self, mesh: Mesh, op: Op, option: ShardingOption, blocks: Mapping[Device, Block],
                 kv_shards: Sequence[Shards], cut: Cut):
        self.mesh, self.op, self.ring, self.blocks = mesh, op, option.ring, blocks
        self.kv_shards, self.cut = kv_shards, cut
        self.n, self.axis = mesh.axis_size(option.ring), mesh.axis_index(option.ring)
        self.keys_per_block = op.nest.extents[KEY_LOOP] // self.n

    def shift(self, shards: Shards) -> Shards:
        """Every device passes its block on: the device at c receives c - 1's."""
        return shift(shards, self.mesh, (self.ring,), self.ring, 1, rotate=True)

    def steps(self) -> Iterator[list[tuple[Device, Block, list[np.ndarray], Context]]]:
        """Each step's (device, step block, its inputs, its context) of every device, from the
        devices' own blocks; the K/V blocks are shifted between steps."""
        held = [dict(s) for s in self.kv_shards]
        for j in range(self.n):
            found = []
            for device, block in self.blocks.items():
                step = ring_step_block(block, (device[self.axis] - j) % self.n, self.keys_per_block)
                inputs = [held[i - 1][device] if i in (1, 2) else self.cut(i, device, step)
                          for i in range(len(self.op.inputs))]
                out_shape = map_extent(self.op.nest.output_maps[0], step.sizes)
                found.append((device, step, inputs, Context(self.op.nest, step, self.op.attrs, (out_shape,))))
            yield found
            if j < self.n - 1:
                held = [self.shift(s) for s in held]


def ring_attention(mesh: Mesh, op: Op, option: ShardingOption, blocks: Mapping[Device, Block],
                   kv_shards: Sequence[Shards], cut: Cut) -> dict[Device, np.ndarray]:
    """Every device's result of an attention or an attention gradient. `kv_shards` are the
    devices' own K and V blocks (split along the keys over the ring axis); `cut` reads the other
    inputs (queries, mask, the output's gradient), which the device holds for every key."""
    ring = _Ring(mesh, op, option, blocks, kv_shards, cut)
    if op.kind == "grad":
        return _ring_gradient(ring)
    state: dict[Device, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    for step in ring.steps():
        for device, _, inputs, ctx in step:
            state[device] = _fold(state.get(device), attention_block_state(inputs, ctx))
    return {device: weighted / exp_sum[..., None] for device, (_, exp_sum, weighted) in state.items()}


def _ring_gradient(ring: _Ring) -> dict[Device, np.ndarray]:
    op, wrt = ring.op, ring.op.attrs["wrt"]
    stats: dict[Device, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    for step in ring.steps():  # the row statistics of every key
        for device, _, inputs, ctx in step:
            row_max = attention_grad_row_max(inputs, ctx)
            stats[device] = _fold(stats.get(device), (row_max, *attention_grad_sums(inputs, ctx, row_max)))
    out: dict[Device, np.ndarray] = {}
    keys_dim = loop_position(op.nest.output_maps[0], KEY_LOOP, op.nest.extents)
    for step in ring.steps():
        for device, block, inputs, ctx in step:
            grad = attention_grad_block(inputs, ctx, *stats[device])
            if wrt in (1, 2) or keys_dim is None or keys_dim < 0:  # dk, dv (its block's), dq, a mask broadcast
                out[device] = out[device] + grad if device in out else grad
                continue
            if device not in out:  # a mask's gradient: this block's columns
                out[device] = np.zeros(map_extent(op.nest.output_maps[0], ring.blocks[device].sizes), grad.dtype)
            columns = [slice(None)] * grad.ndim
            columns[keys_dim] = slice(block.starts[KEY_LOOP], block.starts[KEY_LOOP] + block.sizes[KEY_LOOP])
            out[device][tuple(columns)] = grad
        if wrt in (1, 2):  # the accumulators go on with their blocks; after the last step, home
            out = ring.shift(out)
    return out


def _fold(running: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
          block: tuple[np.ndarray, np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The running (row maximum, sums, sums) with one more block's: the sums of both rescaled to
    their common row maximum (`ops.nn.rescale_block_state`; the second sums are rows of values,
    or rows)."""
    if running is None:
        return block
    new_max = np.maximum(running[0], block[0])
    old, new = _against(running, new_max), _against(block, new_max)
    return new_max, old[0] + new[0], old[1] + new[1]


def _against(state: tuple[np.ndarray, np.ndarray, np.ndarray], new_max: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    row_max, sums, more = state
    lifted = more[..., None] if more.ndim == row_max.ndim else more
    sums, lifted = rescale_block_state(row_max, sums, lifted, new_max)
    return sums, lifted.reshape(more.shape)
