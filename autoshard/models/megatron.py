"""The GPT layer as Megatron-LM ran it in 2022 (Korthikanti et al., "Reducing Activation
Recomputation in Large Transformer Models"): unfused attention whose scores, softmax and dropout
are tensors of their own, dropout after the softmax, the output projection and the second MLP
matmul with explicit masks, biases and layer norms where Megatron has them.

Written so that what the backward keeps is what the paper counts: the masks are boolean inputs
(one byte an element) applied by `select`, whose gradient reads only the mask; the causal mask is
an added bias, whose gradient reads nothing; the score scaling is folded into Q. Kept per layer
(s sequence, b microbatch, h hidden, a heads, 16-bit activations): the two norms' inputs, the
inputs of the QKV, output-projection and both MLP matmuls, Q, K, V, the softmax output, its
dropout mask and output, the GeLU's input, and the two residual dropout masks — sbh(34 + 5as/h).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autoshard.graph.builder import GraphBuilder
from autoshard.models.training import language_model_head

if TYPE_CHECKING:  # gpt.py builds its megatron style here
    from autoshard.models.gpt import GPTConfig


class MegatronLayer:
    """The layer pieces, writing into one builder."""

    def __init__(self, b: GraphBuilder, config: GPTConfig):
        self.b, self.c = b, config
        self.zero = b.input("dropout.zero", (), config.dtype)
        self.keep_scale = b.input("dropout.keep_scale", (), config.dtype)  # 1 / (1 - p)

    def dropout(self, x: str, name: str) -> str:
        mask = self.b.input(f"{name}.mask", self.b.shape(x), "bool", batch_dim=0)
        kept = self.b.op("select", [mask, self.zero, x], f"{name}.kept")
        return self.b.op("mul", [kept, self.keep_scale], name)

    def norm(self, x: str, name: str) -> str:
        h = self.c.hidden
        return self.b.op("layer_norm", [x, self.b.parameter(f"{name}.gamma", (h,)),
                                        self.b.parameter(f"{name}.beta", (h,))], name, eps=1e-5)

    def linear(self, x: str, size_in: int, size_out: int, name: str) -> str:
        y = self.b.op("matmul", [x, self.b.parameter(f"{name}.w", (size_in, size_out))], f"{name}.matmul")
        return self.b.op("add", [y, self.b.parameter(f"{name}.b", (size_out,))], name)

    def heads(self, x: str, name: str, perm: list[int]) -> str:
        c = self.c
        split = self.b.op("reshape", [x], f"{name}.split", shape=[c.batch, c.seq, c.heads, c.hidden // c.heads])
        return self.b.op("transpose", [split], f"{name}.heads", perm=perm)

    def attention(self, x: str, causal: str, name: str) -> str:
        c, b = self.c, self.b
        scale = b.input(f"{name}.scale", (), c.dtype)  # 1 / sqrt(head dim), folded into Q
        q = b.op("mul", [self.linear(x, c.hidden, c.hidden, f"{name}.q"), scale], f"{name}.q_scaled")
        q = self.heads(q, f"{name}.q", [0, 2, 1, 3])
        k = self.heads(self.linear(x, c.hidden, c.hidden, f"{name}.k"), f"{name}.k", [0, 2, 3, 1])
        v = self.heads(self.linear(x, c.hidden, c.hidden, f"{name}.v"), f"{name}.v", [0, 2, 1, 3])
        scores = b.op("add", [b.op("batch_matmul", [q, k], f"{name}.scores"), causal], f"{name}.masked")
        probs = self.dropout(b.op("softmax", [scores], f"{name}.softmax", axis=-1), f"{name}.attn_dropout")
        o = b.op("transpose", [b.op("batch_matmul", [probs, v], f"{name}.context")], f"{name}.merge",
                 perm=[0, 2, 1, 3])
        o = b.op("reshape", [o], f"{name}.merged", shape=[c.batch, c.seq, c.hidden])
        return self.dropout(self.linear(o, c.hidden, c.hidden, f"{name}.out"), f"{name}.out_dropout")

    def mlp(self, x: str, name: str) -> str:
        c, b = self.c, self.b
        up = b.op("gelu", [self.linear(x, c.hidden, c.ffn_size, f"{name}.fc1")], f"{name}.gelu")
        return self.dropout(self.linear(up, c.ffn_size, c.hidden, f"{name}.fc2"), f"{name}.dropout")


def build_megatron_gpt(config: GPTConfig, training: bool = False) -> GraphBuilder:
    """Embedding and learned positions, `config.layers` Megatron layers, a final norm and the LM
    head (untied), then the loss and training step when `training`."""
    c = config
    b = GraphBuilder(f"megatron_{c.layers}l_{c.hidden}h" + ("_training" if training else ""), c.dtype)
    layer = MegatronLayer(b, c)
    ids = b.input("ids", (c.batch, c.seq), "i32", batch_dim=0)
    x = b.op("embedding", [ids, b.parameter("embed.table", (c.vocab, c.hidden))], "embed")
    x = b.op("add", [x, b.parameter("embed.position", (c.seq, c.hidden))], "embed.position_add")
    causal = b.input("causal_bias", (c.seq, c.seq))  # 0 on and below the diagonal, the lowest number above
    for index in range(c.layers):
        p, b.layer = f"layer{index}", index
        x = b.op("add", [x, layer.attention(layer.norm(x, f"{p}.attn_norm"), causal, f"{p}.attn")],
                 f"{p}.attn_residual")
        x = b.op("add", [x, layer.mlp(layer.norm(x, f"{p}.mlp_norm"), f"{p}.mlp")], f"{p}.mlp_residual")
    b.layer = None
    language_model_head(b, layer.norm(x, "final_norm"), c.hidden, c.vocab, training)
    return b

