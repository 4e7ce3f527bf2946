"""Attention realised as a ring over one mesh axis (`planning.ring_attention`), run under DTensor.

Each rank holds its query block and its own key/value block along the ring axis. At step j of n
it holds key block (c - j) mod n (c its ring coordinate): it starts passing that block to the
next rank, computes the block's scores (the causal mask at the global positions of both blocks,
a mask input's columns of that block) and folds them into its running row maximum, exponent
sums and weighted values, then takes the block the previous rank sent. No K/V is gathered and
nothing is all-reduced.

The pass is a point-to-point rotation written as `all_to_all_single` whose split sizes send the
whole block to one peer and receive one block from one peer (nothing to the others), sizes
computed from the rank's coordinate on the ring axis: a plain int in a real run, one value per
rank under LocalTensorMode.

The backward (`RingAttention.backward`) walks the ring again from the saved row maximum and
exponent sums: dq accumulates on the rank; dk and dv accumulators travel with their key/value
block and take one last step home, so each rank ends with the gradient of its own keys.
"""

from __future__ import annotations

from typing import Any, Sequence

from autoshard.errors import InputError
from autoshard.frontends.torch.context_parallel import attention_scores, block_positions, finite_shift, summed_to
from autoshard.frontends.torch.runtime import require_torch

torch = require_torch()
import torch.distributed._functional_collectives as funcol  # noqa: E402  (after the check above)


class Ring:
    """Passing blocks one place along a mesh dim: the rank at coordinate c sends to c + 1 and
    receives from c - 1 (rotating)."""

    def __init__(self, device_mesh: Any, mesh_dim: int):
        self.group, self.size = (device_mesh, mesh_dim), device_mesh.size(mesh_dim)
        coordinate = device_mesh.get_local_rank(mesh_dim)
        self._to = [self._one_if((coordinate + 1 - peer) % self.size) for peer in range(self.size)]
        self._from = [self._one_if((coordinate - 1 - peer) % self.size) for peer in range(self.size)]

    def _one_if(self, residue: Any) -> Any:
        """1 where `residue` (in [0, n)) is 0, else 0, by arithmetic (a per-rank value allows no branch)."""
        return 1 - (residue + self.size - 1) // self.size

    def start(self, x: Any) -> Any:
        """Begin passing `x` on; `finish` gives the block received in its place."""
        flat = x.contiguous().reshape(-1)
        sizes = [flat.numel() * s for s in self._to], [flat.numel() * s for s in self._from]
        return funcol.all_to_all_single(flat, sizes[1], sizes[0], self.group), x.shape

    @staticmethod
    def finish(started: tuple[Any, Any]) -> Any:
        received, shape = started
        return funcol.wait_tensor(received).reshape(shape)


class RingAttention(torch.autograd.Function):
    """The rank's attention output [B, H, S, E]; see the module docstring. `own_keys` are the
    global positions of the rank's own key block; at step j the block held is its own shifted j
    blocks back, so its positions are (own_keys - j * block) mod T."""

    @staticmethod
    def forward(ctx: Any, q: Any, k: Any, v: Any, mask: Any, rows: Any, own_keys: Any, causal: bool, scale: float,
                ring: Ring, keys: int, mask_keys_dim: int | None) -> Any:
        block = k.shape[2]
        running = None
        held = (k, v)
        for j in range(ring.size):
            passing = [ring.start(x) for x in held] if j < ring.size - 1 else []
            cols = (own_keys - j * block) % keys
            index = _own_block(own_keys, block) - j
            scores = attention_scores(q, held[0], _ring_mask(mask, block, index, ring.size, mask_keys_dim), rows, cols,
                                      causal, scale)
            running = _fold(running, scores, held[1])
            held = tuple(ring.finish(p) for p in passing)
        row_max, exp_sum, weighted = running
        out = weighted / exp_sum[..., None]
        ctx.save_for_backward(q, k, v, mask, rows, own_keys, out, row_max, exp_sum)
        ctx.settings = causal, scale, ring, keys, mask_keys_dim
        return out

    @staticmethod
    def backward(ctx: Any, d_out: Any) -> tuple[Any, ...]:
        q, k, v, mask, rows, own_keys, out, row_max, exp_sum = ctx.saved_tensors
        causal, scale, ring, keys, mask_keys_dim = ctx.settings
        block = k.shape[2]
        shift = finite_shift(row_max)[..., None]
        rowdot = (d_out * out).sum(-1, keepdim=True)  # rowsum(p * dp) over all the keys
        dq = torch.zeros_like(q)
        d_mask = torch.zeros_like(mask) if mask is not None and ctx.needs_input_grad[3] else None
        held = (k, v, torch.zeros_like(k), torch.zeros_like(v))  # dk, dv travel with their block
        for j in range(ring.size):
            index = _own_block(own_keys, block) - j
            scores = attention_scores(q, held[0], _ring_mask(mask, block, index, ring.size, mask_keys_dim), rows,
                                      (own_keys - j * block) % keys, causal, scale)
            p = torch.exp(scores - shift) / exp_sum[..., None]
            ds = p * (torch.einsum("bhse,bhte->bhst", d_out, held[1]) - rowdot)
            dq = dq + torch.einsum("bhst,bhtd->bhsd", ds, held[0]) * scale
            dk = held[2] + torch.einsum("bhst,bhsd->bhtd", ds, q) * scale
            dv = held[3] + torch.einsum("bhst,bhse->bhte", p, d_out)
            if d_mask is not None:
                d_mask = _add_columns(d_mask, ds, block, index, ring.size, mask_keys_dim)
            # the block and its accumulators go on; after the last step only the accumulators, home
            moving = (held[0], held[1], dk, dv) if j < ring.size - 1 else (dk, dv)
            received = [Ring.finish(ring.start(x)) for x in moving]
            held = tuple(received) if j < ring.size - 1 else (None, None, *received)
        return dq, held[2], held[3], d_mask, None, None, None, None, None, None, None


def _own_block(own_keys: Any, block: int) -> Any:
    """The index of the rank's own key block, as a one-element tensor (per rank)."""
    return own_keys[:1] // block


def _ring_mask(mask: Any, block: int, index: Any, n: int, keys_dim: int | None) -> Any:
    """The mask's columns of key block `index` mod n (a per-rank index: gathered, not narrowed)."""
    if mask is None or keys_dim is None:
        return mask
    columns = (index % n) * block + torch.arange(block)
    return mask.index_select(keys_dim, columns)


def _add_columns(d_mask: Any, ds: Any, block: int, index: Any, n: int, keys_dim: int) -> Any:
    """`d_mask` with the scores' gradient of key block `index` added to its columns."""
    columns = (index % n) * block + torch.arange(block)
    shape = d_mask.shape[:keys_dim] + (block,) + d_mask.shape[keys_dim + 1:]
    return d_mask.index_add(keys_dim, columns, summed_to(ds, shape))


def _fold(running: tuple[Any, Any, Any] | None, scores: Any, v: Any) -> tuple[Any, Any, Any]:
    """The running row maximum, exponent sums and weighted values with one more block's scores."""
    block_max = scores.amax(-1)
    new_max = block_max if running is None else torch.maximum(running[0], block_max)
    shift = finite_shift(new_max)
    weights = torch.exp(scores - shift[..., None])
    exp_sum, weighted = weights.sum(-1), torch.einsum("bhst,bhte->bhse", weights, v)
    if running is not None:
        factor = torch.exp(running[0] - shift)  # 0 where the running rows were all masked
        exp_sum, weighted = exp_sum + running[1] * factor, weighted + running[2] * factor[..., None]
    return new_max, exp_sum, weighted


def ring_attention(op_name: str, blocks: list[Any], attrs: dict[str, Any], query_axes: Sequence[str], ring: str,
                   lengths: tuple[int, int], mask_keys_dim: int | None, device_mesh: Any) -> Any:
    """The rank's block of an attention op realised as a ring over mesh axis `ring` (its
    queries split over `query_axes`); `blocks` are its q, its own k and v blocks (and its mask
    rows over every key), `lengths` the whole query and key lengths, `mask_keys_dim` the mask's
    dim over the keys (None where it broadcasts over them)."""
    mesh_axes = tuple(device_mesh.mesh_dim_names)
    n = device_mesh.size(mesh_axes.index(ring))
    if lengths[1] % n:
        raise InputError(f"attention op {op_name!r} passes its {lengths[1]} keys around ring axis {ring!r} of {n} "
                         f"devices, which needs equal blocks", f"/ops/{op_name}/ring")
    q, k, v, *rest = blocks
    rows = block_positions(lengths[0], query_axes, mesh_axes, device_mesh)
    own_keys = block_positions(lengths[1], (ring,), mesh_axes, device_mesh)
    scale = attrs.get("scale", 1.0 / q.shape[-1] ** 0.5)
    return RingAttention.apply(q, k, v, rest[0] if rest else None, rows, own_keys, bool(attrs.get("causal", False)),
                               float(scale), Ring(device_mesh, mesh_axes.index(ring)), lengths[1], mask_keys_dim)
