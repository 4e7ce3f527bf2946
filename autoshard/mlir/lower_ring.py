"""An attention realised as a ring (`planning.ring_attention`) in the partitioned IR.

The n steps are unrolled (n, the ring axis' size, is static). Step j computes the device's queries
against the key/value block it holds, block (c - j) mod n of the ring coordinate c (its global
key offset feeds the causal mask; a mask input is sliced to that block's keys), and folds the
block's online-softmax state into the running one (both rescaled to their common row maximum,
as `sim.ring_attention`). Between steps the key and value blocks move one place along the ring
axis: a rotating `shift`, the dialect's collective permute. After the last step the weighted
values are divided by the exponent sums. No all_gather, no all_reduce.
"""

from __future__ import annotations

from dataclasses import replace

from autoshard.mlir.collectives import emit_shift
from autoshard.mlir.device import DeviceIndex
from autoshard.mlir.linalg import Operand, Spec
from autoshard.mlir.lower import (LoweringContext, attention_block_state, attention_logits, divided, elementwise_like,
                                  rescaled)
from autoshard.mlir.scalar import combine, payload
from autoshard.mlir.text import Body
from autoshard.ops.loops import loop_position
from autoshard.ops.nn import KEY_LOOP

State = tuple[Operand, Operand, Operand]  # row maximum, exponent sums, weighted values


def lower_ring(b: Body, device: DeviceIndex, ctx: LoweringContext, ring: str) -> list[Operand]:
    """The device's attention result, its K/V blocks passed around `ring`."""
    n = device.mesh.axis_size(ring)
    q, k, v, *mask = ctx.inputs
    block = ctx.op.nest.extents[KEY_LOOP] // n
    state: State | None = None
    for j in range(n):
        start = device.ring_block_start(ring, j, block)
        inputs = (q, k, v) + tuple(_key_slice(b, ctx, m, start, block) for m in mask)
        step = replace(ctx, inputs=inputs, offset=lambda loop, s=start: s if loop == KEY_LOOP else ctx.offset(loop))
        found = attention_block_state(b, step, attention_logits(b, step), v)
        state = found if state is None else _fold(b, ctx, state, found)
        if j < n - 1:  # pass the blocks on: the device at c receives c - 1's
            k, v = (emit_shift(b, device.dialect, device.mesh, (ring,), ring, 1, x, x.spec, f"{name}_ring")
                    for x, name in ((k, "k"), (v, "v")))
    _, exp_sum, weighted = state
    return [divided(b, ctx, weighted, exp_sum)]


def _fold(b: Body, ctx: LoweringContext, running: State, block: State) -> State:
    """The running state with one more block's, both against their common row maximum."""
    dtype = running[0].dtype
    new_max = elementwise_like(b, [running[0], block[0]], lambda b, a: combine(b, "max", a[0], a[1], dtype, ctx.where),
                               "running_max")
    old_sum, old_weighted = rescaled(b, ctx, *running, new_max)
    new_sum, new_weighted = rescaled(b, ctx, *block, new_max)
    add = lambda b, a: payload(b, "add", a, dtype, "")  # noqa: E731
    return (new_max, elementwise_like(b, [old_sum, new_sum], add, "running_sum"),
            elementwise_like(b, [old_weighted, new_weighted], add, "running_weighted"))


def _key_slice(b: Body, ctx: LoweringContext, mask: Operand, start: str, block: int) -> Operand:
    """The mask's columns of the key block from `start` (the whole mask where it does not index
    the keys: a broadcast dim)."""
    dim = loop_position(ctx.op.nest.maps[3], KEY_LOOP, ctx.op.nest.extents)
    if dim is None or dim < 0 or mask.shape[dim] == 1:
        return mask
    spec = Spec(mask.shape[:dim] + (block,) + mask.shape[dim + 1:], mask.dtype,
                mask.sizes[:dim] + (block,) + mask.sizes[dim + 1:])
    offsets = ", ".join(start if d == dim else "0" for d in range(len(mask.shape)))
    sizes = ", ".join(str(s) for s in spec.sizes)
    name = b.name("mask_block")
    b.emit(f"{name} = tensor.extract_slice {mask.name}[{offsets}] [{sizes}] [{', '.join(['1'] * len(mask.shape))}] "
           f": {mask.type} to {spec.type}")
    return Operand(name, spec)
