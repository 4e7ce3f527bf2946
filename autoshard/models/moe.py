"""Mixture-of-experts layers with capacity-based dispatch in groups (GShard's einsum formulation).

Tokens are cut into G groups of S tokens (`group_size`), each group routed on its own with a
capacity of C = ceil(top_k * S * capacity_factor / E) slots per expert. On tokens x [G, S, H]:
the router's gates softmax(x Wr) [G, S, E]; the assignment of tokens to expert slots `dispatch`
[G, S, E, C] is an input (top-k selection decides it outside the graph: it is not
differentiable); then

    expert inputs   [G, E, C, H] = dot_general(dispatch, x)               (batch G, contract S)
    expert MLPs     [E, G, C, H] = act(xe W1[E, H, F]) W2[E, F, H]         (batch E)
    combine         [G, S, H]    = dot_general(gates * dispatch, ye)      (batch G, contract E, C)

Dispatch and combine cost 2 G S E C H = 2 T top_k capacity_factor S H FLOPs each (T = G S
tokens): linear in tokens at a fixed group size, where one group of every token would be
quadratic. Groups are a loop of the dispatch and experts a loop of every op after it, so the
expert MLPs' inputs are [G, E, ...] as dispatched and [E, G, ...] as computed: a plan that
splits the tokens' groups over a mesh axis before the experts and the experts over it after
moves them with an all-to-all, as expert parallelism does on real machines.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from autoshard.errors import Problem
from autoshard.graph.builder import GraphBuilder
from autoshard.models.checks import float_dtype, one_of, positive_ints, raise_problems
from autoshard.models.training import add_training_step, weighted_sum_loss
from autoshard.ops.payloads import UNARY


def routing_problems(config: Any, prefix: str = "") -> list[Problem]:
    """Problems of a config's routing fields, named `{prefix}experts`, `{prefix}top_k`,
    `{prefix}capacity_factor` and `{prefix}group_size` (None: one group per sequence)."""
    experts, top_k = getattr(config, f"{prefix}experts"), getattr(config, f"{prefix}top_k")
    factor, group = getattr(config, f"{prefix}capacity_factor"), getattr(config, f"{prefix}group_size")
    problems = positive_ints(config, f"{prefix}experts", f"{prefix}top_k",
                             *((f"{prefix}group_size",) if group is not None else ()))
    if not problems and top_k > experts:
        problems.append(Problem(f"{prefix}top_k", f"must be at most {prefix}experts ({experts}), got {top_k}"))
    if not isinstance(factor, (int, float)) or isinstance(factor, bool) or not 0 < factor < math.inf:
        problems.append(Problem(f"{prefix}capacity_factor", f"must be a positive number, got {factor!r}"))
    tokens = config.batch * config.seq
    if not problems and group is not None and tokens % group:
        problems.append(Problem(f"{prefix}group_size", f"must divide the tokens (batch * seq = {tokens}), got {group}"))
    return problems


def capacity(top_k: int, group_size: int, capacity_factor: float, experts: int) -> int:
    """Expert slots per group: the group's routed tokens spread evenly, times the factor."""
    return math.ceil(top_k * group_size * capacity_factor / experts)


def expert_linear(b: GraphBuilder, x: str, size_out: int, name: str, experts_dim: int = 0) -> str:
    """x [E, G, C, K] (or as dispatched, [G, E, C, K] with `experts_dim` 1) times each expert's
    weights [E, K, N]: [E, G, C, N]."""
    shape = b.shape(x)
    w = b.parameter(f"{name}.w", (shape[experts_dim], shape[-1], size_out))
    return b.op("dot_general", [x, w], name, lhs_batch_dims=[experts_dim], rhs_batch_dims=[0],
                lhs_contracting_dims=[len(shape) - 1], rhs_contracting_dims=[1])


def routed_experts(b: GraphBuilder, tokens: str, experts: int, slots: int, name: str,
                   expert_mlp: Callable[[str, str], str]) -> str:
    """tokens [G, S, H] through the router, the dispatch to `slots` per expert and group, the
    experts (`expert_mlp(xe [G, E, C, H], name)` -> [E, G, C, H], built with `expert_linear`)
    and the weighted combine: [G, S, H]. The dispatch is an input named `{name}.dispatch`."""
    g, s, h = b.shape(tokens)
    logits = b.op("matmul", [tokens, b.parameter(f"{name}.router.w", (h, experts))], f"{name}.router")
    gates = b.op("softmax", [logits], f"{name}.gates")
    dispatch = b.input(f"{name}.dispatch", (g, s, experts, slots), batch_dim=0)  # groups, batch-major
    spread = b.op("broadcast_in_dim", [gates], f"{name}.gates_per_slot", shape=[g, s, experts, slots],
                  broadcast_dimensions=[0, 1, 2])
    combine = b.op("mul", [spread, dispatch], f"{name}.combine_weights")
    xe = b.op("dot_general", [dispatch, tokens], f"{name}.dispatch_tokens", lhs_batch_dims=[0], rhs_batch_dims=[0],
              lhs_contracting_dims=[1], rhs_contracting_dims=[1])
    ye = expert_mlp(xe, f"{name}.experts")
    return b.op("dot_general", [combine, ye], f"{name}.combine", lhs_batch_dims=[0], rhs_batch_dims=[1],
                lhs_contracting_dims=[2, 3], rhs_contracting_dims=[0, 2])


@dataclass(frozen=True, slots=True)
class MoEConfig:
    layers: int = 1
    batch: int = 8
    seq: int = 1024
    hidden: int = 1024
    ffn: int | None = None  # default 4 * hidden
    experts: int = 8
    top_k: int = 2
    capacity_factor: float = 1.25
    group_size: int | None = None  # tokens per dispatch group, default seq
    dtype: str = "bf16"
    activation: str = "gelu"

    def __post_init__(self) -> None:
        problems = positive_ints(self, "layers", "batch", "seq", "hidden", *(("ffn",) if self.ffn is not None else ()))
        problems += routing_problems(self) if not problems else []
        raise_problems(problems + float_dtype(self.dtype) + one_of(self.activation, UNARY, "activation"))

    @property
    def ffn_size(self) -> int:
        return self.ffn if self.ffn is not None else 4 * self.hidden

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    @property
    def tokens_per_group(self) -> int:
        return self.group_size if self.group_size is not None else self.seq

    @property
    def capacity(self) -> int:
        return capacity(self.top_k, self.tokens_per_group, self.capacity_factor, self.experts)


def build_moe(config: MoEConfig, training: bool = False) -> GraphBuilder:
    c = config
    h, f, s = c.hidden, c.ffn_size, c.tokens_per_group
    b = GraphBuilder("moe_training" if training else "moe", c.dtype)
    x = b.input("x", (c.batch, c.seq, h), batch_dim=0)
    tokens = b.op("reshape", [x], "tokens", shape=[c.tokens // s, s, h])

    def expert_mlp(xe: str, name: str) -> str:
        act = b.op(c.activation, [expert_linear(b, xe, f, f"{name}.fc1", experts_dim=1)], f"{name}.act")
        return expert_linear(b, act, h, f"{name}.fc2")

    for layer in range(c.layers):
        p, b.layer = f"layer{layer}", layer
        y = routed_experts(b, tokens, c.experts, c.capacity, p, expert_mlp)
        tokens = b.op("add", [tokens, y], f"{p}.residual")
    b.layer = None
    out = b.op("reshape", [tokens], "out", shape=[c.batch, c.seq, h])
    if training:
        add_training_step(b, *weighted_sum_loss(b, out))
    else:
        b.mark_outputs(out)
    return b


def moe(config: MoEConfig, training: bool = False) -> dict[str, Any]:
    """The graph document of the MoE stack (forward, or the whole training step)."""
    return build_moe(config, training).document()
