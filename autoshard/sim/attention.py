"""Attention and its gradient with the key loop split (context parallelism), run as the devices
run them.

Forward: each device computes its block of keys' online-softmax state
(`ops.nn.attention_block_state`: row maximum, exponent sums, weighted values); the blocks are
combined over the key loop's mesh axes by the mesh collectives themselves: `all_reduce` max of
the row maxima, each device's rescaling of its sums and values to that maximum, `all_reduce` sum
of both, then the division. A device whose block holds no keys (an uneven split) contributes the
empty state (maximum -inf, sums and values 0) and receives the combined result like the others.

Gradient: the row statistics of all the keys are combined first (`all_reduce` max of the row
maxima, then `all_reduce` sum of each block's exponent sums and of its rowsum(exp(s - M) * dP));
each device then computes its own gradient block (`ops.grads.attention_grad_block`), partial over
the key axes for dq, its own keys' rows for dk and dv. A device without keys contributes the
neutral statistics and computes nothing (the caller fills its empty or zero block).
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from autoshard.graph.model import Op
from autoshard.mesh import Device, Mesh
from autoshard.ops import Block
from autoshard.ops.grads import attention_grad_block, attention_grad_row_max, attention_grad_sums, attention_key_axes
from autoshard.ops.loops import map_extent
from autoshard.ops.nn import attention_block_state, rescale_block_state
from autoshard.ops.table import Context
from autoshard.planning.options import ShardingOption
from autoshard.sim.collectives import Shards, all_reduce


def splits_keys(op: Op, option: ShardingOption) -> bool:
    """Whether `option` splits the key loop of an attention op or an attention gradient (its
    blocks then need the combine)."""
    return bool(attention_key_axes(op.kind, op.attrs, option.loop_axes))


def combine_key_blocks(mesh: Mesh, op: Op, option: ShardingOption, blocks: Mapping[Device, Block],
                       cuts: Mapping[Device, Sequence[np.ndarray]], dtype: np.dtype) -> dict[Device, np.ndarray]:
    """The devices' results of a key-split attention (every device) or attention gradient (every
    device holding keys)."""
    if op.kind == "attention":
        return key_split_attention(mesh, op, option, blocks, cuts, dtype)
    return _key_split_gradient(mesh, op, option, blocks, cuts, dtype)


def _context(op: Op, block: Block) -> Context:
    return Context(op.nest, block, op.attrs, (map_extent(op.nest.output_maps[0], block.sizes),))


def key_split_attention(mesh: Mesh, op: Op, option: ShardingOption, blocks: Mapping[Device, Block],
                        cuts: Mapping[Device, Sequence[np.ndarray]], dtype: np.dtype) -> dict[Device, np.ndarray]:
    """Every device's attention output: its key block's state, combined over the key axes."""
    axes = attention_key_axes(op.kind, op.attrs, option.loop_axes)
    row_max: Shards = {}
    exp_sum: Shards = {}
    weighted: Shards = {}
    for device, block in blocks.items():
        b, h, s, e = block.sizes[:4]
        if 0 in block.sizes:
            row_max[device] = np.full((b, h, s), -np.inf, dtype)
            exp_sum[device], weighted[device] = np.zeros((b, h, s), dtype), np.zeros((b, h, s, e), dtype)
            continue
        row_max[device], exp_sum[device], weighted[device] = attention_block_state(cuts[device], _context(op, block))
    global_max = all_reduce(row_max, mesh, axes, "max")
    for device in blocks:
        exp_sum[device], weighted[device] = rescale_block_state(row_max[device], exp_sum[device], weighted[device],
                                                                global_max[device])
    total_sum = all_reduce(exp_sum, mesh, axes, "sum")
    total = all_reduce(weighted, mesh, axes, "sum")
    return {device: total[device] / total_sum[device][..., None] for device in blocks}


def _key_split_gradient(mesh: Mesh, op: Op, option: ShardingOption, blocks: Mapping[Device, Block],
                        cuts: Mapping[Device, Sequence[np.ndarray]], dtype: np.dtype) -> dict[Device, np.ndarray]:
    axes = attention_key_axes(op.kind, op.attrs, option.loop_axes)
    rows = {device: tuple(block.sizes[:3]) for device, block in blocks.items()}
    row_max: Shards = {device: attention_grad_row_max(list(cuts[device]), _context(op, block))
                       if device in cuts else np.full(rows[device], -np.inf, dtype) for device, block in blocks.items()}
    global_max = all_reduce(row_max, mesh, axes, "max")
    exp_sum: Shards = {}
    dot_sum: Shards = {}
    for device, block in blocks.items():
        if device in cuts:
            exp_sum[device], dot_sum[device] = attention_grad_sums(list(cuts[device]), _context(op, block),
                                                                   global_max[device])
        else:
            exp_sum[device], dot_sum[device] = np.zeros(rows[device], dtype), np.zeros(rows[device], dtype)
    total_sum = all_reduce(exp_sum, mesh, axes, "sum")
    total_dot = all_reduce(dot_sum, mesh, axes, "sum")
    return {device: attention_grad_block(list(cuts[device]), _context(op, block), global_max[device],
                                         total_sum[device], total_dot[device])
            for device, block in blocks.items() if device in cuts}
