"""Small PyTorch modules for the frontend tests, written with torch.nn (nothing downloaded):
an MLP, a LLaMA-style decoder block (RMSNorm, RoPE, GQA attention, SwiGLU) and a two-layer GPT.

Weights dominate their memory at these shapes, so a memory budget below the replicated footprint
makes a plan shard the linear weights."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    def __init__(self, hidden: int = 32, ffn: int = 128):
        super().__init__()
        self.up = nn.Linear(hidden, ffn)
        self.down = nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x), approximate="tanh"))


def rotary_tables(seq: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seq, dtype=torch.float32), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class LlamaBlock(nn.Module):
    def __init__(self, hidden: int = 64, heads: int = 8, kv_heads: int = 4, ffn: int = 128, seq: int = 8):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        self.attention_norm = nn.RMSNorm(hidden, eps=1e-6)
        self.wq = nn.Linear(hidden, hidden, bias=False)
        self.wk = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(hidden, hidden, bias=False)
        self.ffn_norm = nn.RMSNorm(hidden, eps=1e-6)
        self.gate = nn.Linear(hidden, ffn, bias=False)
        self.up = nn.Linear(hidden, ffn, bias=False)
        self.down = nn.Linear(ffn, hidden, bias=False)
        cos, sin = rotary_tables(seq, self.head_dim)
        self.register_buffer("cos", cos)
        self.register_buffer("sin", sin)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        y = self.attention_norm(x)
        q = self.wq(y).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.wk(y).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(y).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = rotate(q, self.cos, self.sin), rotate(k, self.cos, self.sin)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.wo(o.transpose(1, 2).reshape(b, s, h))
        y = self.ffn_norm(x)
        return x + self.down(F.silu(self.gate(y)) * self.up(y))


class GPTLayer(nn.Module):
    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln_2 = nn.LayerNorm(hidden)
        self.fc = nn.Linear(hidden, 4 * hidden)
        self.out = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(h, dim=-1)
        q, k, v = (t.view(b, s, self.heads, h // self.heads).transpose(1, 2) for t in (q, k, v))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(o.transpose(1, 2).reshape(b, s, h))
        return x + self.out(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))  # GPT-2's gelu


class GPT(nn.Module):
    def __init__(self, vocab: int = 64, hidden: int = 32, heads: int = 4, layers: int = 2, seq: int = 8):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.position = nn.Parameter(torch.randn(seq, hidden) * 0.02)
        self.layers = nn.ModuleList(GPTLayer(hidden, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids) + self.position
        for layer in self.layers:
            x = layer(x)
        return self.head(self.ln_f(x))


def examples() -> dict[str, tuple[nn.Module, tuple[torch.Tensor, ...]]]:
    """name -> (module in eval mode with fixed random weights, example inputs)."""
    torch.manual_seed(0)
    return {
        "mlp": (MLP().eval(), (torch.randn(4, 32),)),
        "llama_block": (LlamaBlock().eval(), (torch.randn(2, 8, 64),)),
        "gpt": (GPT().eval(), (torch.randint(0, 64, (2, 8)),)),
    }


def exported(module: nn.Module, args: tuple[torch.Tensor, ...]) -> torch.export.ExportedProgram:
    return torch.export.export(module, args).run_decompositions({})
