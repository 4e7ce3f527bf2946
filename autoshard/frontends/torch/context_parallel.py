"""Attention with its key loop split over mesh axes (context parallelism), run under DTensor.

Each rank holds a block of the keys and values (and of the mask), and the queries its option
gives it. It computes its block's scores with the causal mask at the global positions of both
blocks, then the online-softmax combine over the key axes as the plan prices it and the
simulator runs it (`sim.attention`): `all_reduce` max of the row maxima, the exponent sums and the
weighted values against that maximum, `all_reduce` sum of both, the division. Taking the
exponents against the global maximum at once (rather than against the block's own and rescaling)
gives the same values: the maximum is known before any exponent is taken.

The backward is explicit (`KeySplitAttention.backward`): the probabilities are recomputed from
the saved global row maximum and exponent sums; dv and dk are the rank's own keys' rows, dq is a
partial sum over the key axes that DTensor reduces (the query block's gradient placement says
`Partial`, see `ShardedProgram._block_grad_placements`). Letting autograd differentiate the
functional `all_reduce` instead would sum the output's gradient over the key ranks, where every
rank already holds the whole of it (a replicated value's gradient is not partial), and has no
rule for the `max`.
"""

from __future__ import annotations

from typing import Any, Sequence

from autoshard.errors import InputError
from autoshard.frontends.torch.runtime import require_torch

torch = require_torch()
import torch.distributed._functional_collectives as funcol  # noqa: E402  (after the check above)
from torch.distributed.tensor import Replicate, Shard, distribute_tensor  # noqa: E402

Groups = Sequence[tuple[Any, int]]  # (device mesh, mesh dim) of each key axis


def block_positions(length: int, axes: Sequence[str], mesh_axes: Sequence[str], device_mesh: Any) -> Any:
    """Each rank's global positions of a sequence of `length` split over `axes` (major first, as
    the blocks of the queries or keys it holds): a distributed arange, so the positions come
    from the same chunking as the blocks themselves."""
    placements = [Shard(0) if axis in axes else Replicate() for axis in mesh_axes]
    return distribute_tensor(torch.arange(length), device_mesh, placements, src_data_rank=None).to_local()


def _all_reduce(x: Any, kind: str, groups: Groups) -> Any:
    for group in groups:  # over several axes: one all_reduce per axis covers their product
        x = funcol.wait_tensor(funcol.all_reduce(x.contiguous(), kind, group))
    return x


def attention_scores(q: Any, k: Any, mask: Any, rows: Any, cols: Any, causal: bool, scale: float) -> Any:
    """q k^T * scale of the rank's blocks, -inf where the causal mask (at global positions) or a
    bool mask drops a pair; a float mask is added."""
    scores = torch.einsum("bhsd,bhtd->bhst", q, k) * scale
    if mask is not None and mask.dtype != torch.bool:
        scores = scores + mask
    keep = cols[None, :] <= rows[:, None] if causal else None
    if mask is not None and mask.dtype == torch.bool:
        keep = mask if keep is None else keep & mask
    return scores if keep is None else scores.masked_fill(~keep, float("-inf"))


def summed_to(ds: Any, shape: Sequence[int]) -> Any:
    """The scores' gradient [B, H, S, T] as an added mask's of `shape` (right-aligned to the
    scores, as it broadcast): summed over the dims it lacks and those where it has size 1."""
    lead = ds.dim() - len(shape)
    summed = ds.sum(dim=list(range(lead))) if lead else ds
    wide = [d for d, size in enumerate(shape) if size == 1 and summed.shape[d] != 1]
    return summed.sum(dim=wide, keepdim=True) if wide else summed


def finite_shift(row_max: Any) -> Any:
    """The row maximum to take exponents against: 0 where a row is masked everywhere (its
    exponents are then all 0, and it stays 0 / 0 as unsplit)."""
    return torch.where(torch.isneginf(row_max), torch.zeros_like(row_max), row_max)


class KeySplitAttention(torch.autograd.Function):
    """The rank's attention output [B, H, S, E] given its key block; see the module docstring."""

    @staticmethod
    def forward(ctx: Any, q: Any, k: Any, v: Any, mask: Any, rows: Any, cols: Any, causal: bool, scale: float,
                groups: Groups) -> Any:
        scores = attention_scores(q, k, mask, rows, cols, causal, scale)
        shift = finite_shift(_all_reduce(scores.amax(-1), "max", groups))
        weights = torch.exp(scores - shift[..., None])
        exp_sum = _all_reduce(weights.sum(-1), "sum", groups)
        out = _all_reduce(torch.einsum("bhst,bhte->bhse", weights, v), "sum", groups) / exp_sum[..., None]
        ctx.save_for_backward(q, k, v, mask, rows, cols, out, shift, exp_sum)
        ctx.causal, ctx.scale = causal, scale
        return out

    @staticmethod
    def backward(ctx: Any, d_out: Any) -> tuple[Any, ...]:
        q, k, v, mask, rows, cols, out, shift, exp_sum = ctx.saved_tensors
        scores = attention_scores(q, k, mask, rows, cols, ctx.causal, ctx.scale)
        p = torch.exp(scores - shift[..., None]) / exp_sum[..., None]
        dv = torch.einsum("bhst,bhse->bhte", p, d_out)
        dp = torch.einsum("bhse,bhte->bhst", d_out, v)
        # rowsum(p * dp) over all the keys, from the whole output every rank holds
        ds = p * (dp - (d_out * out).sum(-1, keepdim=True))
        dq = torch.einsum("bhst,bhtd->bhsd", ds, k) * ctx.scale  # partial over the key axes
        dk = torch.einsum("bhst,bhsd->bhtd", ds, q) * ctx.scale
        d_mask = summed_to(ds, mask.shape) if mask is not None and ctx.needs_input_grad[3] else None
        return dq, dk, dv, d_mask, None, None, None, None, None


def key_split_attention(op_name: str, blocks: list[Any], attrs: dict[str, Any], query_axes: Sequence[str],
                        key_axes: Sequence[str], lengths: tuple[int, int], device_mesh: Any) -> Any:
    """The rank's block of an attention op whose option splits the key loop over `key_axes` and
    the queries over `query_axes`; `blocks` are its q, k, v (and mask) blocks, `lengths` the
    whole query and key lengths."""
    mesh_axes = tuple(device_mesh.mesh_dim_names)
    for what, length, axes in (("queries", lengths[0], query_axes), ("keys", lengths[1], key_axes)):
        parts = 1
        for axis in axes:
            parts *= device_mesh.size(mesh_axes.index(axis))
        if length % parts:
            raise InputError(f"attention op {op_name!r} splits its {length} {what} over {list(axes)} ({parts} blocks) "
                             f"unevenly, which the DTensor run of a key split does not take: plan an even split",
                             f"/ops/{op_name}/option")
    q, k, v, *rest = blocks
    rows = block_positions(lengths[0], query_axes, mesh_axes, device_mesh)
    cols = block_positions(lengths[1], key_axes, mesh_axes, device_mesh)
    scale = attrs.get("scale", 1.0 / q.shape[-1] ** 0.5)
    groups = [(device_mesh, mesh_axes.index(axis)) for axis in key_axes]
    return KeySplitAttention.apply(q, k, v, rest[0] if rest else None, rows, cols, bool(attrs.get("causal", False)),
                                   float(scale), groups)
