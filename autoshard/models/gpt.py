"""Decoder-only transformers: GPT (learned positions, layer norm, biases, gelu MLP) and LLaMA
style (rms norm, no biases, SwiGLU MLP; rotary positions are left out: they are elementwise
per head and change no sharding choice).

Per layer: norm, Q/K/V projections [B,S,H] x [H,H], heads as a reshaped dim
([B,S,H] -> [B,S,heads,hd] -> [B,heads,S,hd]), causal attention, back to [B,S,H], output
projection, residual; norm, MLP, residual. Then a final norm and the LM head to [B,S,vocab].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autoshard.errors import Problem
from autoshard.graph.builder import GraphBuilder
from autoshard.models.checks import float_dtype, one_of, positive_ints, raise_problems
from autoshard.models.training import add_training_step, cross_entropy_loss

STYLES = ("gpt", "llama")


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

    def __post_init__(self) -> None:
        problems = positive_ints(self, "layers", "hidden", "heads", "seq", "batch", "vocab",
                                 *(("ffn",) if self.ffn is not None else ()))
        if not problems and self.hidden % self.heads:
            problems.append(Problem("heads", f"must divide hidden ({self.hidden}), got {self.heads}"))
        raise_problems(problems + float_dtype(self.dtype) + one_of(self.style, STYLES, "style"))

    @property
    def ffn_size(self) -> int:
        return self.ffn if self.ffn is not None else 4 * self.hidden


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

    def heads(self, x: str, name: str) -> str:
        c = self.c
        split = self.b.op("reshape", [x], f"{name}.split", shape=[c.batch, c.seq, c.heads, c.hidden // c.heads])
        return self.b.op("transpose", [split], f"{name}.heads", perm=[0, 2, 1, 3])

    def attention(self, x: str, name: str) -> str:
        h, b = self.c.hidden, self.b
        q, k, v = (self.heads(self.linear(x, h, h, f"{name}.{n}"), f"{name}.{n}") for n in "qkv")
        o = b.op("attention", [q, k, v], f"{name}.sdpa", causal=True)
        o = b.op("transpose", [o], f"{name}.merge", perm=[0, 2, 1, 3])
        o = b.op("reshape", [o], f"{name}.merged", shape=[self.c.batch, self.c.seq, h])
        return self.linear(o, h, h, f"{name}.out")

    def mlp(self, x: str, name: str) -> str:
        h, f, b = self.c.hidden, self.c.ffn_size, self.b
        if self.gpt:
            return self.linear(b.op("gelu", [self.linear(x, h, f, f"{name}.fc1")], f"{name}.gelu"), f, h, f"{name}.fc2")
        gate = b.op("silu", [self.linear(x, h, f, f"{name}.gate")], f"{name}.silu")
        return self.linear(b.op("mul", [gate, self.linear(x, h, f, f"{name}.up")], f"{name}.glu"), f, h, f"{name}.down")


def build_gpt(config: GPTConfig, training: bool = False) -> GraphBuilder:
    c = config
    b = GraphBuilder(f"{c.style}_{c.layers}l_{c.hidden}h" + ("_training" if training else ""), c.dtype)
    blocks = _Blocks(b, c)
    ids = b.input("ids", (c.batch, c.seq), "i32", batch_dim=0)
    x = b.op("embedding", [ids, b.parameter("embed.table", (c.vocab, c.hidden))], "embed")
    if blocks.gpt:
        x = b.op("add", [x, b.parameter("embed.position", (c.seq, c.hidden))], "embed.position_add")
    for layer in range(c.layers):
        p, b.layer = f"layer{layer}", layer
        x = b.op("add", [x, blocks.attention(blocks.norm(x, f"{p}.attn_norm"), f"{p}.attn")], f"{p}.attn_residual")
        x = b.op("add", [x, blocks.mlp(blocks.norm(x, f"{p}.mlp_norm"), f"{p}.mlp")], f"{p}.mlp_residual")
    b.layer = None
    x = blocks.norm(x, "final_norm")
    logits = b.op("matmul", [x, b.parameter("lm_head.w", (c.hidden, c.vocab))], "logits")
    if training:
        add_training_step(b, *cross_entropy_loss(b, logits))
    else:
        b.mark_outputs(logits)
    return b


def gpt(config: GPTConfig, training: bool = False) -> dict[str, Any]:
    """The graph document of the transformer (forward to logits, or the whole training step)."""
    return build_gpt(config, training).document()
