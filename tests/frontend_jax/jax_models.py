"""The functions the JAX tests plan, written with jax.numpy: an MLP, a LLaMA-style block (RMSNorm,
rotary positions, grouped-query attention, SwiGLU), a training step (`jax.grad` of a loss) and a
MaxText-style decoder (an embedding lookup, the blocks' parameters stacked on a leading layer axis
and run by `jax.lax.scan`, logits) and a mixture of experts routed by `top_k`."""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

BATCH, SEQ, HIDDEN, HEADS, KV_HEADS, FFN = 2, 16, 64, 8, 4, 256
LAYERS, VOCAB = 2, 512
TOKENS, EXPERTS, TOP_K = 16, 8, 2
HEAD_DIM = HIDDEN // HEADS


def mlp(params: dict[str, Any], x: jax.Array) -> jax.Array:
    return jax.nn.gelu(x @ params["w1"]) @ params["w2"]


def rms_norm(x: jax.Array, gamma: jax.Array, eps: float = 1e-6) -> jax.Array:
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * gamma


def rotary(x: jax.Array) -> jax.Array:
    """Rotate-half rotary positions on x [B, S, heads, head_dim]."""
    half = x.shape[-1] // 2
    freqs = 1.0 / (10000.0 ** (jnp.arange(half, dtype=jnp.float32) / half))
    angles = jnp.arange(x.shape[1], dtype=jnp.float32)[:, None] * freqs[None, :]
    cos = jnp.concatenate([jnp.cos(angles)] * 2, axis=-1)[None, :, None, :]
    sin = jnp.concatenate([jnp.sin(angles)] * 2, axis=-1)[None, :, None, :]
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


def attention(p: dict[str, Any], x: jax.Array) -> jax.Array:
    b, s, _ = x.shape
    q = rotary((x @ p["wq"]).reshape(b, s, HEADS, HEAD_DIM))
    k = rotary((x @ p["wk"]).reshape(b, s, KV_HEADS, HEAD_DIM))
    v = (x @ p["wv"]).reshape(b, s, KV_HEADS, HEAD_DIM)
    group = HEADS // KV_HEADS
    q = q.reshape(b, s, KV_HEADS, group, HEAD_DIM)
    scores = jnp.einsum("bskgd,btkd->bkgst", q, k) / jnp.sqrt(float(HEAD_DIM))
    causal = jnp.arange(s)[:, None] >= jnp.arange(s)[None, :]
    scores = jnp.where(causal, scores, -1e9)
    out = jnp.einsum("bkgst,btkd->bskgd", jax.nn.softmax(scores, axis=-1), v)
    return out.reshape(b, s, HIDDEN) @ p["wo"]


def llama_block(params: dict[str, Any], x: jax.Array) -> jax.Array:
    x = x + attention(params, rms_norm(x, params["attn_norm"]))
    h = rms_norm(x, params["mlp_norm"])
    return x + (jax.nn.silu(h @ params["w_gate"]) * (h @ params["w_up"])) @ params["w_down"]


def decoder(params: dict[str, Any], ids: jax.Array) -> jax.Array:
    """Logits of token ids [B, S]: each layer one step of a scan over the stacked blocks."""
    x = jnp.take(params["embed"], ids, axis=0)
    x, _ = jax.lax.scan(lambda h, layer: (llama_block(layer, h), None), x, params["layers"])
    return rms_norm(x, params["final_norm"]) @ params["lm_head"]


def moe(params: dict[str, Any], x: jax.Array) -> jax.Array:
    """Experts [E, D, F] run on every token x [T, D], their outputs weighed by a combine matrix
    [T, E]: each token's top-k router probabilities written at its experts (zero elsewhere)."""
    weights, experts = jax.lax.top_k(x @ params["router"], TOP_K)
    tokens = jnp.arange(x.shape[0])[:, None]
    combine = jnp.zeros((x.shape[0], EXPERTS), x.dtype).at[tokens, experts].set(jax.nn.softmax(weights))
    h = jax.nn.gelu(jnp.einsum("td,edf->tef", x, params["w_in"]))
    return jnp.einsum("te,ted->td", combine, jnp.einsum("tef,efd->ted", h, params["w_out"]))


def mlp_loss(params: dict[str, Any], x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((mlp(params, x) - y) ** 2)


def training_step(params: dict[str, Any], x: jax.Array, y: jax.Array) -> dict[str, Any]:
    """One SGD step: the loss's gradient (jax.grad), applied to the parameters."""
    grads = jax.grad(mlp_loss)(params, x, y)
    return jax.tree_util.tree_map(lambda w, g: w - 0.1 * g, params, grads)


def _normal(key: jax.Array, shape: tuple[int, ...], scale: float) -> jax.Array:
    return scale * jax.random.normal(key, shape, jnp.float32)


def mlp_args(batch: int = 16, hidden: int = HIDDEN, ffn: int = FFN) -> tuple[Any, ...]:
    k = jax.random.split(jax.random.key(0), 3)
    params = {"w1": _normal(k[0], (hidden, ffn), hidden ** -0.5), "w2": _normal(k[1], (ffn, hidden), ffn ** -0.5)}
    return params, _normal(k[2], (batch, hidden), 1.0)


def llama_args() -> tuple[Any, ...]:
    k = jax.random.split(jax.random.key(1), 9)
    kv = KV_HEADS * HEAD_DIM
    params = {"attn_norm": 1.0 + _normal(k[0], (HIDDEN,), 0.1), "mlp_norm": 1.0 + _normal(k[1], (HIDDEN,), 0.1),
              "wq": _normal(k[2], (HIDDEN, HIDDEN), HIDDEN ** -0.5), "wk": _normal(k[3], (HIDDEN, kv), HIDDEN ** -0.5),
              "wv": _normal(k[4], (HIDDEN, kv), HIDDEN ** -0.5), "wo": _normal(k[5], (HIDDEN, HIDDEN), HIDDEN ** -0.5),
              "w_gate": _normal(k[6], (HIDDEN, FFN), HIDDEN ** -0.5), "w_up": _normal(k[7], (HIDDEN, FFN), HIDDEN ** -0.5),
              "w_down": _normal(k[8], (FFN, HIDDEN), FFN ** -0.5)}
    return params, _normal(jax.random.key(2), (BATCH, SEQ, HIDDEN), 1.0)


def decoder_args() -> tuple[Any, ...]:
    block = llama_args()[0]
    k = jax.random.split(jax.random.key(4), 4)
    params = {"embed": _normal(k[0], (VOCAB, HIDDEN), 1.0), "final_norm": 1.0 + _normal(k[1], (HIDDEN,), 0.1),
              "lm_head": _normal(k[2], (HIDDEN, VOCAB), HIDDEN ** -0.5),
              # layer i is the block's weights scaled by 1 + i/2, so no two layers are alike
              "layers": jax.tree_util.tree_map(lambda w: jnp.stack([(1.0 + 0.5 * i) * w for i in range(LAYERS)]),
                                               block)}
    return params, jax.random.randint(k[3], (BATCH, SEQ), 0, VOCAB, jnp.int32)


def moe_args() -> tuple[Any, ...]:
    k = jax.random.split(jax.random.key(5), 4)
    params = {"router": _normal(k[0], (HIDDEN, EXPERTS), 1.0), "w_in": _normal(k[1], (EXPERTS, HIDDEN, FFN), HIDDEN ** -0.5),
              "w_out": _normal(k[2], (EXPERTS, FFN, HIDDEN), FFN ** -0.5)}
    return params, _normal(k[3], (TOKENS, HIDDEN), 1.0)


def training_args() -> tuple[Any, ...]:
    params, x = mlp_args()
    return params, x, _normal(jax.random.key(3), x.shape, 1.0)


CASES: dict[str, tuple[Callable[..., Any], Callable[[], tuple[Any, ...]]]] = {
    "mlp": (mlp, mlp_args),
    "llama_block": (llama_block, llama_args),
    "training_step": (training_step, training_args),
}
