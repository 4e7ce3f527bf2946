"""Mixture-of-experts layers with capacity-based dispatch (GShard's einsum formulation).

Per layer, on tokens x [T, H] (T = batch * seq): the router's gates softmax(x Wr) [T, E]; the
assignment of tokens to expert slots `dispatch` [T, E, C] is an input (top-k selection decides
it outside the graph: it is not differentiable); then

    expert inputs   [E, C, H] = dot_general(dispatch, x)          (contract T)
    expert MLPs     [E, C, H] = act(xe W1[E, H, F]) W2[E, F, H]     (batch_matmul over E)
    combine         [T, H]    = dot_general(gates * dispatch, ye)  (contract E, C)

and a residual add. Experts are a loop of every op after dispatch, so splitting that loop over a
mesh axis is expert parallelism. C = ceil(top_k * T * capacity_factor / E).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from autoshard.errors import Problem
from autoshard.graph.builder import GraphBuilder
from autoshard.models.checks import float_dtype, one_of, positive_ints, raise_problems
from autoshard.models.training import add_training_step, weighted_sum_loss
from autoshard.ops.payloads import UNARY


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
    dtype: str = "bf16"
    activation: str = "gelu"

    def __post_init__(self) -> None:
        problems = positive_ints(self, "layers", "batch", "seq", "hidden", "experts", "top_k",
                                 *(("ffn",) if self.ffn is not None else ()))
        if isinstance(self.top_k, int) and isinstance(self.experts, int) and self.top_k > self.experts:
            problems.append(Problem("top_k", f"must be at most experts ({self.experts}), got {self.top_k}"))
        if not isinstance(self.capacity_factor, (int, float)) or not 0 < self.capacity_factor < math.inf:
            problems.append(Problem("capacity_factor", f"must be a positive number, got {self.capacity_factor!r}"))
        raise_problems(problems + float_dtype(self.dtype) + one_of(self.activation, UNARY, "activation"))

    @property
    def ffn_size(self) -> int:
        return self.ffn if self.ffn is not None else 4 * self.hidden

    @property
    def tokens(self) -> int:
        return self.batch * self.seq

    @property
    def capacity(self) -> int:
        return math.ceil(self.top_k * self.tokens * self.capacity_factor / self.experts)


def build_moe(config: MoEConfig, training: bool = False) -> GraphBuilder:
    c = config
    t, e, cap, h, f = c.tokens, c.experts, c.capacity, c.hidden, c.ffn_size
    b = GraphBuilder("moe_training" if training else "moe", c.dtype)
    x = b.input("x", (c.batch, c.seq, h), batch_dim=0)
    tokens = b.op("reshape", [x], "tokens", shape=[t, h])
    for layer in range(c.layers):
        p, b.layer = f"layer{layer}", layer
        logits = b.op("matmul", [tokens, b.parameter(f"{p}.router.w", (h, e))], f"{p}.router")
        gates = b.op("softmax", [logits], f"{p}.gates")
        dispatch = b.input(f"{p}.dispatch", (t, e, cap), batch_dim=0)  # tokens, batch-major
        spread = b.op("broadcast_in_dim", [gates], f"{p}.gates_per_slot", shape=[t, e, cap], broadcast_dimensions=[0, 1])
        combine = b.op("mul", [spread, dispatch], f"{p}.combine_weights")
        xe = b.op("dot_general", [dispatch, tokens], f"{p}.dispatch_tokens",
                  lhs_contracting_dims=[0], rhs_contracting_dims=[0])
        hidden = b.op("batch_matmul", [xe, b.parameter(f"{p}.experts.w1", (e, h, f))], f"{p}.experts.fc1")
        act = b.op(c.activation, [hidden], f"{p}.experts.act")
        ye = b.op("batch_matmul", [act, b.parameter(f"{p}.experts.w2", (e, f, h))], f"{p}.experts.fc2")
        y = b.op("dot_general", [combine, ye], f"{p}.combine", lhs_contracting_dims=[1, 2], rhs_contracting_dims=[0, 1])
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
