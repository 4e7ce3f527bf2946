"""Attention realised as a ring over one mesh axis (`planning.ring_attention`), run as the
devices run it.

Each device starts with its query block and its own block of the keys and values along the ring
axis. At step j (of n, the axis size) the device at ring coordinate c holds key block
(c - j) mod n: it computes that block's online-softmax state (`ops.nn.attention_block_state`,
with the causal mask at the global positions of both blocks) and folds it into its running row
maximum, exponent sums and weighted values; then every device passes its K/V block to the next
one (`shift` by one, rotating) and receives the previous one's. After n steps each device has
seen every block and divides. Nothing is gathered and nothing is all-reduced.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np

from autoshard.graph.model import Op
from autoshard.mesh import Device, Mesh
from autoshard.ops import Block
from autoshard.ops.loops import map_extent
from autoshard.ops.nn import KEY_LOOP, attention_block_state, rescale_block_state
from autoshard.ops.table import Context
from autoshard.planning.options import ShardingOption
from autoshard.sim.collectives import Shards, shift

# (input index, device, block) -> the part of the device's shard of that input the block reads
Cut = Callable[[int, Device, Block], np.ndarray]


def ring_step_block(block: Block, key_block: int, keys_per_block: int) -> Block:
    """The device's block at a ring step: its own loops, the keys of block `key_block`."""
    starts, sizes = list(block.starts), list(block.sizes)
    starts[KEY_LOOP], sizes[KEY_LOOP] = key_block * keys_per_block, keys_per_block
    return Block(tuple(starts), tuple(sizes), block.extents)


def ring_attention(mesh: Mesh, op: Op, option: ShardingOption, blocks: Mapping[Device, Block],
                   kv_shards: Sequence[Shards], cut: Cut) -> dict[Device, np.ndarray]:
    """Every device's attention output. `kv_shards` are the devices' own K and V blocks (split
    along the keys over the ring axis); `cut` reads the other inputs (queries, mask), which the
    device holds for every key."""
    ring = option.ring
    n, axis = mesh.axis_size(ring), mesh.axis_index(ring)
    keys_per_block = op.nest.extents[KEY_LOOP] // n
    held = [dict(s) for s in kv_shards]
    state: dict[Device, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    for j in range(n):
        for device, block in blocks.items():
            step = ring_step_block(block, (device[axis] - j) % n, keys_per_block)
            inputs = [cut(i, device, step) if i not in (1, 2) else held[i - 1][device] for i in range(len(op.inputs))]
            ctx = Context(op.nest, step, op.attrs, (map_extent(op.nest.output_maps[0], step.sizes),))
            state[device] = _fold(state.get(device), attention_block_state(inputs, ctx))
        if j < n - 1:  # pass the block on: the device at c receives c - 1's
            held = [shift(s, mesh, (ring,), ring, 1, rotate=True) for s in held]
    return {device: weighted / exp_sum[..., None] for device, (_, exp_sum, weighted) in state.items()}


def _fold(running: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
          block: tuple[np.ndarray, np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The running state with one more block's: both rescaled to their common row maximum."""
    if running is None:
        return block
    new_max = np.maximum(running[0], block[0])
    old_sum, old_weighted = rescale_block_state(*running, new_max)
    new_sum, new_weighted = rescale_block_state(*block, new_max)
    return new_max, old_sum + new_sum, old_weighted + new_weighted
