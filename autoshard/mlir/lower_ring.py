"""An attention realised as a ring (`planning.ring_attention`) in the partitioned IR.

The n steps are unrolled (n, the ring axis' size, is static). Step j computes the device's queries
against the key/value block it holds, block (c - j) mod n of the ring coordinate c (its global
key offset feeds the causal mask; a mask input is sliced to that block's keys), and folds the
block's online-softmax state into the running one (both rescaled to their common row maximum,
as `sim.ring_attention`). Between steps the key and value blocks move one place along the ring
axis: a rotating `shift`, the dialect's collective permute. After the last step the weighted
values are divided by the exponent sums. No all_gather, no all_reduce.

A gradient walks the ring twice from the device's own blocks (as `sim.ring_attention`): first
folding the row statistics of every key (row maximum M, exponent sums l, rowsum(exp(s - M) dp)),
then computing its gradient block at each step from them; dq accumulates on the device, dk's or
dv's accumulator is shifted with its key/value block and once more after the last step, home.
"""

from __future__ import annotations

from dataclasses import replace

from typing import Callable, Iterator

from autoshard.affine import AffineExpr, AffineMap
from autoshard.errors import InputError
from autoshard.mlir.collectives import emit_shift
from autoshard.mlir.device import DeviceIndex
from autoshard.mlir.linalg import Operand, Spec, generic, reduction_init
from autoshard.mlir.lower import (LoweringContext, attention_block_state, attention_logits, divided, elementwise_like,
                                  exp_against, rescaled)
from autoshard.mlir.lower_grad import (Arith, attention_grad_block, attention_grad_dp, attention_grad_logits,
                                       parallel_nest, summed)
from autoshard.mlir.scalar import combine, payload
from autoshard.mlir.text import Body
from autoshard.ops.loops import loop_position
from autoshard.ops.nn import KEY_LOOP

State = tuple[Operand, Operand, Operand]  # row maximum, exponent sums, weighted values (or rowsum(exp(s - M) dp))
ROWS = AffineMap(4, tuple(AffineExpr.loop(l) for l in (0, 1, 2)))  # scores [B, H, S, T] -> rows [B, H, S]


def lower_ring(b: Body, device: DeviceIndex, ctx: LoweringContext, ring: str) -> list[Operand]:
    """The device's attention (or attention gradient) result, its K/V blocks passed around `ring`."""
    if ctx.op.kind == "grad":
        return [_ring_gradient(b, device, ctx, ring)]
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
            k, v = _shift(b, device, ring, k, "k"), _shift(b, device, ring, v, "v")
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


def _shift(b: Body, device: DeviceIndex, ring: str, x: Operand, name: str) -> Operand:
    """`x` passed one place along the ring: the device at c receives c - 1's."""
    return emit_shift(b, device.dialect, device.mesh, (ring,), ring, 1, x, x.spec, f"{name}_ring")


def _ring_gradient(b: Body, device: DeviceIndex, ctx: LoweringContext, ring: str) -> Operand:
    if len(ctx.inputs) != 4:
        raise InputError(f"op {ctx.op.name!r} (gradient of attention with a mask input) is not lowered to MLIR yet",
                         ctx.where)
    n, wrt = device.mesh.axis_size(ring), ctx.op.attrs["wrt"]
    q, k, v, dy = ctx.inputs
    block = ctx.op.nest.extents[KEY_LOOP] // n

    def walk() -> Iterator[LoweringContext]:
        """The step contexts from the device's own blocks, the blocks shifted between steps."""
        held = (k, v)
        for j in range(n):
            start = device.ring_block_start(ring, j, block)
            yield replace(ctx, inputs=(q, *held, dy),
                          offset=lambda loop, s=start: s if loop == KEY_LOOP else ctx.offset(loop))
            if j < n - 1:
                held = (_shift(b, device, ring, held[0], "k"), _shift(b, device, ring, held[1], "v"))
    stats = None
    for step in walk():
        logits = attention_grad_logits(b, step)
        stats = _fold_statistics(b, stats, logits, attention_grad_dp(b, dy, step.inputs[2], logits.spec))
    row_max, exp_sum, dot_sum = stats
    rowdot = elementwise_like(b, [dot_sum, exp_sum], lambda b, a: payload(b, "div", a, q.dtype, ""), "rowdot")
    total: Operand | None = None
    for step in walk():
        logits = attention_grad_logits(b, step)
        p = parallel_nest(b, [logits, row_max, exp_sum], [AffineMap.identity(4), ROWS, ROWS], logits.spec,
                          lambda a, x: a.op("div", exp_against(a.b, x[0], x[1], q.dtype), x[2]), "weights")
        dp = None if wrt == 2 else attention_grad_dp(b, dy, step.inputs[2], logits.spec)
        grad = attention_grad_block(b, step, wrt, p, dp, rowdot)
        total = grad if total is None else elementwise_like(b, [total, grad], _add(q.dtype), ctx.op.outputs[0])
        if wrt in (1, 2):  # the accumulator goes on with its block; after the last step, home
            total = _shift(b, device, ring, total, ctx.op.outputs[0])
    return total


def _fold_statistics(b: Body, running: State | None, logits: Operand, dp: Operand) -> State:
    """The running row maximum M, exponent sums l and rowsum(exp(s - M) dp) with one more block:
    the block's sums taken against the new maximum, the running ones rescaled to it."""
    dtype, rows_spec = logits.dtype, logits.spec.take((0, 1, 2))
    identity, rows = AffineMap.identity(4), ROWS
    reduce_keys = ["parallel"] * 3 + ["reduction"]
    block_max = generic(b, [identity, rows], reduce_keys, [logits], reduction_init(b, rows_spec, "max"),
                        lambda b, args, acc: combine(b, "max", acc, args[0], dtype, ""), hint="row_max")
    new_max = block_max if running is None else elementwise_like(
        b, [running[0], block_max], lambda b, a: combine(b, "max", a[0], a[1], dtype, ""), "running_max")
    exp_sum = summed(b, [logits, new_max], [identity, rows, rows], reduce_keys, rows_spec,
                     lambda a, x: exp_against(a.b, x[0], x[1], dtype), "exp_sum")
    dot_sum = summed(b, [logits, new_max, dp], [identity, rows, identity, rows], reduce_keys, rows_spec,
                     lambda a, x: a.mul(exp_against(a.b, x[0], x[1], dtype), x[2]), "dot_sum")
    if running is None:
        return new_max, exp_sum, dot_sum

    def carried(a: Arith, x: list[str]) -> str:  # running sum * exp(M - M') + the block's
        return a.op("add", a.mul(x[0], exp_against(a.b, x[1], x[2], dtype)), x[3])
    three = [AffineMap.identity(3)] * 4
    return (new_max,
            parallel_nest(b, [running[1], running[0], new_max, exp_sum], three, rows_spec, carried, "running_sum"),
            parallel_nest(b, [running[2], running[0], new_max, dot_sum], three, rows_spec, carried, "running_dot"))


def _add(dtype: str) -> Callable[[Body, list[str]], str]:
    return lambda b, a: payload(b, "add", a, dtype, "")
