"""Attention with its key loop split (context parallelism), run as the devices run it.

Each device computes its block of keys' online-softmax state (`ops.nn.attention_block_state`:
row maximum, exponent sums, weighted values); the blocks are combined over the key loop's mesh
axes by the mesh collectives themselves: `all_reduce` max of the row maxima, each device's
rescaling of its sums and values to that maximum, `all_reduce` sum of both, then the division.
A device whose block holds no keys (an uneven split) contributes the empty state: maximum -inf,
sums and values 0.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from autoshard.graph.model import Op
from autoshard.mesh import Device, Mesh
from autoshard.ops import Block
from autoshard.ops.loops import map_extent
from autoshard.ops.nn import KEY_LOOP, attention_block_state, rescale_block_state
from autoshard.ops.table import Context
from autoshard.planning.options import ShardingOption
from autoshard.sim.collectives import Shards, all_reduce


def splits_keys(op: Op, option: ShardingOption) -> bool:
    """Whether `option` splits the key loop of an attention op (its blocks then need the combine)."""
    return op.kind == "attention" and bool(option.loop_axes[KEY_LOOP])


def key_split_attention(mesh: Mesh, op: Op, option: ShardingOption, blocks: Mapping[Device, Block],
                        cuts: Mapping[Device, Sequence[np.ndarray]], dtype: np.dtype) -> dict[Device, np.ndarray]:
    """Every device's attention output: its key block's state, combined over the key axes."""
    axes = option.loop_axes[KEY_LOOP]
    row_max: Shards = {}
    exp_sum: Shards = {}
    weighted: Shards = {}
    for device, block in blocks.items():
        b, h, s, e = block.sizes[:4]
        if 0 in block.sizes:
            row_max[device] = np.full((b, h, s), -np.inf, dtype)
            exp_sum[device], weighted[device] = np.zeros((b, h, s), dtype), np.zeros((b, h, s, e), dtype)
            continue
        ctx = Context(op.nest, block, op.attrs, (map_extent(op.nest.output_maps[0], block.sizes),))
        row_max[device], exp_sum[device], weighted[device] = attention_block_state(cuts[device], ctx)
    global_max = all_reduce(row_max, mesh, axes, "max")
    for device in blocks:
        exp_sum[device], weighted[device] = rescale_block_state(row_max[device], exp_sum[device], weighted[device],
                                                                global_max[device])
    total_sum = all_reduce(exp_sum, mesh, axes, "sum")
    total = all_reduce(weighted, mesh, axes, "sum")
    return {device: total[device] / total_sum[device][..., None] for device in blocks}
