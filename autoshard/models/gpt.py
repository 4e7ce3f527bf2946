"""Decoder-only transformers: GPT (learned positions, layer norm, biases, gelu MLP) and LLaMA
style (rms norm, no biases, SwiGLU MLP; rotary positions are left out: they are elementwise
per head and change no sharding choice).

Per layer: norm, Q/K/V projections [B,S,H] x [H,heads*hd], heads as a reshaped dim
([B,S,heads*hd] -> [B,S,heads,hd] -> [B,heads,S,hd]), causal attention, back to [B,S,H], output
projection, residual; norm, MLP, residual. Then a final norm and the LM head to [B,S,vocab], and
for a training step the token cross-entropy against integer labels.

Grouped-query attention (`kv_heads` < `heads`; 1 is multi-query): K and V are projected to
kv_heads * hd and each K/V head serves heads / kv_heads consecutive query heads, repeated by a
broadcast and a reshape in front of the attention; both are views, so K and V are held at kv
heads and a resharding moves them at that size.

The load-balanced causal layout (`balanced_over` = n, Megatron-LM's and Llama 3's for context
parallelism over n devices): the sequence is stored in 2n chunks ordered 0, 2n - 1, 1, 2n - 2, ...
so a contiguous split over n gives device i chunks i and 2n - 1 - i and every device the same
causal work. The graph holds the sequence in that order from where it enters: token ids and labels
are fed permuted (`to_layout`), the GPT style looks its position embedding up by an input of
position ids (the permuted positions), and attention applies its causal mask at the true positions
(its attribute `balanced_over`, `ops.nn`). The loss is a sum over tokens, so it is the same; the
logits come out in the stored order. A routed MLP then routes groups of the whole sequence, its
dispatch input fed in the stored order too.

An MoE MLP (`moe_experts` > 0) replaces the dense one in every layer: the tokens in groups of
`moe_group_size` (default one sequence) routed to `moe_top_k` of the experts, each an MLP of
the style's form with `moe_ffn` features (fine-grained experts are many narrow ones), plus
`moe_shared_experts` experts every token goes through, as one dense MLP of moe_shared_experts
* moe_ffn features (see `models/moe.py` for the dispatch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autoshard.errors import Problem
from autoshard.graph.builder import GraphBuilder
from autoshard.models.checks import float_dtype, one_of, positive_ints, raise_problems
from autoshard.models.megatron import build_megatron_gpt
from autoshard.models.moe import capacity, expert_linear, routed_experts, routing_problems
from autoshard.models.training import language_model_head
from autoshard.ops.nn import BALANCED, layout_order

POSITION_IDS = "position_ids"  # the balanced layout's input: the position of each stored token

STYLES = ("gpt", "llama", "megatron")  # megatron: `autoshard.models.megatron`


@dataclass(frozen=True, slots=True)
class GPTConfig:
    layers: int = 12
    hidden: int = 768
    heads: int = 12
    seq: int = 1024
    batch: int = 8
    vocab: int = 50257
    ffn: int | None = None  # default 4 * hidden
    dtype: str = "bf16"
    style: str = "gpt"
    kv_heads: int | None = None  # default heads
    moe_experts: int = 0  # 0: a dense MLP
    moe_top_k: int = 2
    moe_ffn: int | None = None  # default ffn
    moe_shared_experts: int = 0
    moe_capacity_factor: float = 1.25
    moe_group_size: int | None = None  # default seq
    balanced_over: int | None = None  # the load-balanced causal layout for this many devices (None: the own order)

    def __post_init__(self) -> None:
        optional = tuple(f for f in ("ffn", "kv_heads", "moe_ffn", "balanced_over") if getattr(self, f) is not None)
        problems = positive_ints(self, "layers", "hidden", "heads", "seq", "batch", "vocab", *optional)
        if not problems and self.hidden % self.heads:
            problems.append(Problem("heads", f"must divide hidden ({self.hidden}), got {self.heads}"))
        if not problems and self.kv_heads is not None and self.heads % self.kv_heads:
            problems.append(Problem("kv_heads", f"must divide heads ({self.heads}), got {self.kv_heads}"))
        for name in ("moe_experts", "moe_shared_experts"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                problems.append(Problem(name, f"must be a non-negative integer, got {value!r}"))
        if not problems and self.moe_experts:
            problems += routing_problems(self, "moe_")
        if not problems and self.balanced_over is not None and self.seq % (2 * self.balanced_over):
            problems.append(Problem("balanced_over", f"the layout stores the sequence in 2 x {self.balanced_over} "
                                                     f"equal chunks, which must divide seq ({self.seq})"))
        if (not problems and self.balanced_over is not None and self.moe_experts
                and self.tokens_per_group != self.seq):  # groups of the stored order would be other tokens
            problems.append(Problem("balanced_over", f"routes tokens in groups of the whole sequence; "
                                                     f"moe_group_size {self.moe_group_size} would group other tokens "
                                                     f"than in the sequence's own order"))
        if self.style == "megatron":  # the 2022 layer: multi-head attention and a dense MLP
            if self.kv_heads not in (None, self.heads):
                problems.append(Problem("kv_heads", f"the megatron style has as many as heads, got {self.kv_heads}"))
            if self.moe_experts:
                problems.append(Problem("moe_experts", f"the megatron style has a dense MLP, got {self.moe_experts}"))
            if self.balanced_over is not None:
                problems.append(Problem("balanced_over", "the megatron style keeps the sequence in its own order; "
                                                         "use style gpt or llama"))
        raise_problems(problems + float_dtype(self.dtype) + one_of(self.style, STYLES, "style"))

    @property
    def ffn_size(self) -> int:
        return self.ffn if self.ffn is not None else 4 * self.hidden

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_head_count(self) -> int:
        return self.kv_heads if self.kv_heads is not None else self.heads

    @property
    def expert_ffn_size(self) -> int:
        return self.moe_ffn if self.moe_ffn is not None else self.ffn_size

    @property
    def tokens_per_group(self) -> int:
        return self.moe_group_size if self.moe_group_size is not None else self.seq


class _Blocks:
    """The layer pieces of one style, writing into one builder."""

    def __init__(self, b: GraphBuilder, config: GPTConfig):
        self.b, self.c = b, config
        self.gpt = config.style == "gpt"

    def norm(self, x: str, name: str) -> str:
        h = self.c.hidden
        gamma = self.b.parameter(f"{name}.gamma", (h,))
        if self.gpt:
            return self.b.op("layer_norm", [x, gamma, self.b.parameter(f"{name}.beta", (h,))], name, eps=1e-5)
        return self.b.op("rms_norm", [x, gamma], name, eps=1e-6)

    def linear(self, x: str, size_in: int, size_out: int, name: str) -> str:
        y = self.b.op("matmul", [x, self.b.parameter(f"{name}.w", (size_in, size_out))], name)
        if self.gpt:
            y = self.b.op("add", [y, self.b.parameter(f"{name}.b", (size_out,))], f"{name}.bias")
        return y

    def heads(self, x: str, name: str, count: int) -> str:
        c = self.c
        split = self.b.op("reshape", [x], f"{name}.split", shape=[c.batch, c.seq, count, c.head_dim])
        return self.b.op("transpose", [split], f"{name}.heads", perm=[0, 2, 1, 3])

    def repeat_heads(self, x: str, name: str) -> str:
        """K or V heads [B, kv, S, hd] as [B, heads, S, hd]: query head i reads K/V head i // group."""
        c = self.c
        group = c.heads // c.kv_head_count
        if group == 1:
            return x
        wide = self.b.op("broadcast_in_dim", [x], f"{name}.repeat",
                         shape=[c.batch, c.kv_head_count, group, c.seq, c.head_dim], broadcast_dimensions=[0, 1, 3, 4])
        return self.b.op("reshape", [wide], f"{name}.grouped", shape=[c.batch, c.heads, c.seq, c.head_dim])

    def attention(self, x: str, name: str) -> str:
        h, b, kv = self.c.hidden, self.b, self.c.kv_head_count
        q = self.heads(self.linear(x, h, h, f"{name}.q"), f"{name}.q", self.c.heads)
        k, v = (self.repeat_heads(self.heads(self.linear(x, h, kv * self.c.head_dim, f"{name}.{n}"), f"{name}.{n}", kv),
                                  f"{name}.{n}") for n in "kv")
        layout = {} if self.c.balanced_over is None else {BALANCED: self.c.balanced_over}
        o = b.op("attention", [q, k, v], f"{name}.sdpa", causal=True, **layout)
        o = b.op("transpose", [o], f"{name}.merge", perm=[0, 2, 1, 3])
        o = b.op("reshape", [o], f"{name}.merged", shape=[self.c.batch, self.c.seq, h])
        return self.linear(o, h, h, f"{name}.out")

    def mlp(self, x: str, name: str, f: int | None = None) -> str:
        h, b = self.c.hidden, self.b
        f = f if f is not None else self.c.ffn_size
        if self.gpt:
            return self.linear(b.op("gelu", [self.linear(x, h, f, f"{name}.fc1")], f"{name}.gelu"), f, h, f"{name}.fc2")
        gate = b.op("silu", [self.linear(x, h, f, f"{name}.gate")], f"{name}.silu")
        return self.linear(b.op("mul", [gate, self.linear(x, h, f, f"{name}.up")], f"{name}.glu"), f, h, f"{name}.down")

    def expert_mlp(self, xe: str, name: str) -> str:
        """The style's MLP in every expert, on the dispatched [G, E, C, H] -> [E, G, C, H]."""
        h, f, b = self.c.hidden, self.c.expert_ffn_size, self.b
        if self.gpt:
            act = b.op("gelu", [expert_linear(b, xe, f, f"{name}.fc1", experts_dim=1)], f"{name}.gelu")
            return expert_linear(b, act, h, f"{name}.fc2")
        gate = b.op("silu", [expert_linear(b, xe, f, f"{name}.gate", experts_dim=1)], f"{name}.silu")
        glu = b.op("mul", [gate, expert_linear(b, xe, f, f"{name}.up", experts_dim=1)], f"{name}.glu")
        return expert_linear(b, glu, h, f"{name}.down")

    def moe_mlp(self, x: str, name: str) -> str:
        c, b = self.c, self.b
        s = c.tokens_per_group
        tokens = b.op("reshape", [x], f"{name}.groups", shape=[c.batch * c.seq // s, s, c.hidden])
        slots = capacity(c.moe_top_k, s, c.moe_capacity_factor, c.moe_experts)
        routed = routed_experts(b, tokens, c.moe_experts, slots, name, self.expert_mlp)
        y = b.op("reshape", [routed], f"{name}.routed", shape=[c.batch, c.seq, c.hidden])
        if c.moe_shared_experts:
            shared = self.mlp(x, f"{name}.shared", c.moe_shared_experts * c.expert_ffn_size)
            y = b.op("add", [y, shared], f"{name}.with_shared")
        return y


def build_gpt(config: GPTConfig, training: bool = False) -> GraphBuilder:
    if config.style == "megatron":
        return build_megatron_gpt(config, training)
    c = config
    b = GraphBuilder(f"{c.style}_{c.layers}l_{c.hidden}h" + ("_training" if training else ""), c.dtype)
    blocks = _Blocks(b, c)
    ids = b.input("ids", (c.batch, c.seq), "i32", batch_dim=0)
    x = b.op("embedding", [ids, b.parameter("embed.table", (c.vocab, c.hidden))], "embed")
    if blocks.gpt:
        positions = b.parameter("embed.position", (c.seq, c.hidden))
        if c.balanced_over is not None:  # each stored token's row of the table, by its position id
            positions = b.op("embedding", [b.input(POSITION_IDS, (c.seq,), "i32"), positions], "embed.position_rows")
        x = b.op("add", [x, positions], "embed.position_add")
    for layer in range(c.layers):
        p, b.layer = f"layer{layer}", layer
        x = b.op("add", [x, blocks.attention(blocks.norm(x, f"{p}.attn_norm"), f"{p}.attn")], f"{p}.attn_residual")
        mlp = blocks.moe_mlp if c.moe_experts else blocks.mlp
        x = b.op("add", [x, mlp(blocks.norm(x, f"{p}.mlp_norm"), f"{p}.mlp")], f"{p}.mlp_residual")
    b.layer = None
    language_model_head(b, blocks.norm(x, "final_norm"), c.hidden, c.vocab, training)
    return b


def sequence_inputs(config: GPTConfig) -> dict[str, int]:
    """The inputs that carry the sequence, and their sequence dim: what a run feeds in the
    layout's order (`to_layout`; `planning.sequence_layout.sequence_entries` finds the same from
    the graph)."""
    found = {"ids": 1, "labels": 1}
    if config.balanced_over is not None and config.style == "gpt":
        found[POSITION_IDS] = 0
    if config.moe_experts:  # the router's assignment [G, N, E, C]: its tokens N, a whole sequence per group
        found.update({f"layer{layer}.mlp.dispatch": 1 for layer in range(config.layers)})
    return found


def to_layout(config: GPTConfig, values: dict[str, Any]) -> dict[str, Any]:
    """A step's inputs in the graph's sequence order: with `balanced_over` = n, token ids, labels
    (and routers' assignments) permuted along the sequence into the balanced order (chunks i and
    2n - 1 - i adjacent) and the position ids that order's positions, as Megatron-LM's
    context-parallel data loader does; the others as given."""
    order = layout_order(config.seq, config.balanced_over)
    out = dict(values)
    for name, dim in sequence_inputs(config).items():
        if name == POSITION_IDS:
            out[name] = order.astype("int32")
        elif name in out:
            out[name] = out[name].take(order, axis=dim)
    return out


def gpt(config: GPTConfig, training: bool = False) -> dict[str, Any]:
    """The graph document of the transformer (forward to logits, or the whole training step)."""
    return build_gpt(config, training).document()
