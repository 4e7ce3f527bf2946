"""Routed experts at a static capacity: the routed-experts chain `routing` finds, written as the
GShard dispatch of `autoshard.models.moe` (groups, slots per expert) instead of the dense one.

The T tokens are cut into G groups of S (`group_size`), each expert taking at most
C = ceil(k * S * capacity_factor / E) of a group's picks. A pick's slot is its rank among its
expert's picks in the group, first choices before second ones (GShard's priority); a pick ranked
past C is dropped, as GShard and Switch drop overflow. On ids [T, k] and weights [T, k]:

    hot    [G, k*S, E]      = one_hot(ids), the picks in priority order      (integers)
    rank   [G, k*S, E]      = cumsum(hot, picks) * hot                       1-based, 0 where not picked
    slots  [G, k, S, E, C]  = one_hot(rank, C + 1)[..., 1:]                  a rank past C: no slot
    dispatch [G, S, E, C]   = sum over k of slots                            (0 or 1: k distinct experts)
    combine  [G, S, E, C]   = dot_general(weights [G, S, k], slots)          contract k
    xe  [G, E, C, H]        = dot_general(dispatch, x [G, S, H])              batch G, contract S
    a   [E, G, C, F1]       = act(dot_general(xe, up [E, H, F1]))             batch E, the program's own ops
    y   [E, G, C, H]        = dot_general(a, down [E, F2, H])                 batch E
    out [G, S, H]           = dot_general(combine, y)                         batch G, contract E, C

The experts cost G E C slots' worth, k * capacity_factor times one expert per token (rounded up
per group); dispatch and combine 2 T k capacity_factor S H each, linear in the tokens: against
the experts' 2 T k capacity_factor H (F1 + F2) they add 2 S / (F1 + F2). So the default group is
the largest divisor of a sequence (the tokens' [B, S, H] before the layer flattened them; all
tokens if they came otherwise) at most (F1 + F2) / 40 tokens: dispatch and combine at most 5 % of
the experts (1,024 tokens for Mixtral 8x7B), in groups no smaller than they need be. The
expert loop is the experts' batch dim and the group loop the dispatch's and combine's, so a plan
splitting groups over a mesh axis around the experts and experts over it inside moves xe and y
with all-to-alls: expert parallelism. With C at least the largest load of an expert in a group
nothing is dropped and the output is the model's, up to float rounding. The expert weights are
read as stored ([E, F1, H] and [E, H, F2], as `nn.Linear` keeps them; the program transposes them
for its grouped matmuls), so the contractions' expert loop indexes the parameters themselves.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from autoshard.errors import InputError, Problem
from autoshard.frontends.torch.aten import ATEN, CHECKS, target_key
from autoshard.frontends.torch.lowering import Lowering
from autoshard.frontends.torch.routing import RESHAPES, RoutedExperts, cast_to, einsum_call
from autoshard.frontends.torch.runtime import require_torch
from autoshard.graph.model import Graph
from autoshard.models.moe import capacity

torch = require_torch()


@dataclass(frozen=True, slots=True)
class ExpertCapacity:
    """Plan imported routed experts at a static capacity (see the module doc).

    `capacity_factor`: slots per expert and group over the even share k * S / E (1.25: a quarter
    spare). `group_size`: tokens per dispatch group, dividing the tokens (None: the module doc's
    default, from a sequence's tokens and the experts' sizes). `slots`: C itself, in place of the
    factor's (a load measured on real batches)."""

    capacity_factor: float = 1.25
    group_size: int | None = None
    slots: int | None = None

    def __post_init__(self) -> None:
        problems = []
        factor, group = self.capacity_factor, self.group_size
        if not isinstance(factor, (int, float)) or isinstance(factor, bool) or not 0 < factor < math.inf:
            problems.append(Problem("expert_capacity/capacity_factor", f"must be a positive number, got {factor!r}"))
        for field, value in (("group_size", group), ("slots", self.slots)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                problems.append(Problem(f"expert_capacity/{field}",
                                        f"must be a positive integer or None, got {value!r}"))
        if problems:
            raise InputError(problems)

    def slots_per_group(self, top_k: int, group_size: int, experts: int) -> int:
        """C: the slots each expert has in a group of `group_size` tokens."""
        return self.slots if self.slots is not None else capacity(top_k, group_size, self.capacity_factor, experts)


def planned_capacity(graph: Graph) -> ExpertCapacity | None:
    """The capacity a graph's routed experts were imported at, read from the dispatches
    [G, S, E, C] this module writes (`<experts>.dispatch`); None if it has none."""
    experts = [op.name.removesuffix(".dispatch_tokens") for op in graph.ops if op.name.endswith(".dispatch_tokens")]
    found = {graph.tensors[f"{name}.dispatch"].shape for name in experts if f"{name}.dispatch" in graph.tensors}
    if not found:
        return None
    if len({(s, c) for _, s, _, c in found}) > 1:
        raise InputError(f"the routed experts were imported at several capacities {sorted(found)} (G, S, E, C)",
                         "expert_capacity")
    (_, group, _, slots), *_ = found
    return ExpertCapacity(group_size=group, slots=slots)


# dispatch and combine cost 2 S / (F1 + F2) of the experts: a default group keeps that within 1/20
DISPATCH_SHARE = 20


def default_group_size(m: RoutedExperts, features: int) -> int:
    """The largest divisor of a sequence's tokens at most `features` (F1 + F2) / 40, at least 1."""
    sequence = sequence_tokens(m)
    bound = max(1, features // (2 * DISPATCH_SHARE))
    return max(d for d in range(1, min(sequence, bound) + 1) if sequence % d == 0)


def sequence_tokens(m: RoutedExperts) -> int:
    """The tokens of one sequence: the tokens [T, H] flattened from [B, S, H] (through reshapes)
    give S; tokens of any other origin are one group."""
    t = int(m.tokens.meta["val"].shape[0])
    node = m.tokens
    while node.op == "call_function" and target_key(node.target) in RESHAPES:
        source = node.args[0]
        shape = tuple(int(s) for s in source.meta["val"].shape)
        if len(shape) == 3 and shape[0] * shape[1] == t:
            return shape[1]
        node = source
    return t


def stored_weight(weight: Any) -> tuple[Any, int]:
    """The node of the expert weights [E, K, N] a grouped matmul reads, and the dim of it that is
    contracted. transformers stores experts as `nn.Linear` does, [E, N, K], and transposes them
    for the grouped matmul alone: then the stored weights, contracted on their last dim, so that the
    contraction reads the parameter itself (whose expert dim the plan's report then calls so)."""
    users = [u for u in weight.users if target_key(u.target) not in CHECKS]
    if weight.op == "call_function" and target_key(weight.target) == "transpose.int" and len(users) == 1:
        rank = len(weight.meta["val"].shape)
        if rank == 3 and sorted(d % rank for d in weight.args[1:3]) == [1, 2]:
            return weight.args[0], 2
    return weight, 1


def absorbed_views(m: RoutedExperts) -> set[str]:
    """The nodes the capacity form reads past (the experts' transposes): not lowered on their own."""
    return {w.name for w in (m.up, m.down) if stored_weight(w)[0] is not w}


def lower_capacity_experts(lw: Lowering, m: RoutedExperts, option: ExpertCapacity) -> str:
    """The capacity dispatch of `m` into `lw`; returns the graph tensor of the experts' output [T, H]."""
    x, ids, w = lw.tensor(m.tokens), lw.tensor(m.expert_ids), lw.tensor(m.weights)
    (up, up_k), (down, down_k) = ((lw.tensor(n), dim) for n, dim in map(stored_weight, (m.up, m.down)))
    name, (t, h), (_, k), experts = m.anchor.name, lw.shape(x), lw.shape(ids), lw.shape(up)[0]
    features = int(m.up.meta["val"].shape[2]) + int(m.down.meta["val"].shape[1])
    s = option.group_size if option.group_size is not None else default_group_size(m, features)
    if t % s:
        raise InputError(f"must divide the tokens of {name} ({t}), got {s}", "expert_capacity/group_size")
    g, c = t // s, option.slots_per_group(k, s, experts)
    x_dtype, w_dtype = m.tokens.meta["val"].dtype, m.weights.meta["val"].dtype
    ours = lw.builder.dtype_of

    def reshape(tensor: str, shape: list[int], role: str) -> str:
        return lw.op("reshape", [tensor], f"{name}.{role}", lambda v: v.reshape(shape), shape=shape)

    # the picks in priority order: a group's first choices, then its second ones, ...
    hot = lw.op("one_hot", [ids], f"{name}.one_hot", lambda i: torch.nn.functional.one_hot(i, experts),
                num_classes=experts, dtype="i64")
    hot = reshape(hot, [g, s, k, experts], "one_hot_groups")
    hot = lw.op("transpose", [hot], f"{name}.picks_by_priority", lambda v: v.permute(0, 2, 1, 3), perm=[0, 2, 1, 3])
    hot = reshape(hot, [g, k * s, experts], "picks")
    running = lw.op("cumulative", [hot], f"{name}.running_load", lambda v: torch.cumsum(v, 1), axis=1, reduction="sum")
    rank = lw.op("mul", [running, hot], f"{name}.rank", lambda a, b: a * b)
    slot = lw.op("one_hot", [rank], f"{name}.slot_or_none",
                 lambda r: torch.nn.functional.one_hot(r, c + 1).to(w_dtype), num_classes=c + 1, dtype=ours(w))
    shape = [g, k * s, experts, c + 1]
    slot = lw.op("slice", [slot], f"{name}.slots", lambda v: v[..., 1:], starts=[0, 0, 0, 1], limits=shape,
                 strides=[1, 1, 1, 1])
    slots = reshape(slot, [g, k, s, experts, c], "slots_by_pick")
    dispatch = lw.op("reduce_sum", [slots], f"{name}.dispatch", lambda v: v.sum(1), dims=[1])
    weights = reshape(w, [g, s, k], "weights")
    combine = lw.op("dot_general", [weights, slots], f"{name}.combine_weights", einsum_call("gsk,gksec->gsec"),
                    lhs_batch_dims=[0, 1], rhs_batch_dims=[0, 2], lhs_contracting_dims=[2], rhs_contracting_dims=[1])

    tokens = reshape(x, [g, s, h], "tokens")
    dispatch = cast_to(lw, dispatch, x_dtype, f"{name}.dispatch_cast")
    xe = lw.op("dot_general", [dispatch, tokens], f"{name}.dispatch_tokens", einsum_call("gsec,gsh->gech"),
               lhs_batch_dims=[0], rhs_batch_dims=[0], lhs_contracting_dims=[1], rhs_contracting_dims=[1])
    lw.values[m.first.name] = lw.op("dot_general", [xe, up], m.first.name,
                                    einsum_call("gech,ehf->egcf" if up_k == 1 else "gech,efh->egcf"),
                                    lhs_batch_dims=[1], rhs_batch_dims=[0], lhs_contracting_dims=[3],
                                    rhs_contracting_dims=[up_k])
    for node in m.activation:
        lw.values[node.name] = ATEN[target_key(node.target)](lw, node)
    y = lw.op("dot_general", [lw.tensor(m.second.args[0]), down], m.second.name,
              einsum_call("egcf,efh->egch" if down_k == 1 else "egcf,ehf->egch"),
              lhs_batch_dims=[0], rhs_batch_dims=[0], lhs_contracting_dims=[3], rhs_contracting_dims=[down_k])
    # the routed form multiplies in the promoted dtype of the expert outputs and the weights
    out_dtype = m.anchor.meta["val"].dtype
    combine, y = (cast_to(lw, v, out_dtype, f"{name}.{role}")
                  for v, role in ((combine, "combine_cast"), (y, "experts_cast")))
    out = lw.op("dot_general", [combine, y], f"{name}.combine", einsum_call("gsec,egch->gsh"),
                lhs_batch_dims=[0], rhs_batch_dims=[1], lhs_contracting_dims=[2, 3], rhs_contracting_dims=[0, 2])
    return lw.op("reshape", [out], name, lambda v: v.reshape(t, h), shape=[t, h])

