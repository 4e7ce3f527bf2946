"""A stack of two-matmul MLP blocks: x [batch, hidden] -> act(x W1) W2 -> ... (the seeds' MLP)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autoshard.graph.builder import GraphBuilder
from autoshard.models.checks import float_dtype, one_of, positive_ints, raise_problems
from autoshard.models.training import add_training_step, weighted_sum_loss
from autoshard.ops.payloads import UNARY


@dataclass(frozen=True, slots=True)
class MLPConfig:
    layers: int = 2
    batch: int = 8
    hidden: int = 1024
    ffn: int | None = None  # default 4 * hidden
    dtype: str = "bf16"
    activation: str = "gelu"

    def __post_init__(self) -> None:
        raise_problems(positive_ints(self, "layers", "batch", "hidden", *(("ffn",) if self.ffn is not None else ()))
                       + float_dtype(self.dtype) + one_of(self.activation, UNARY, "activation"))

    @property
    def ffn_size(self) -> int:
        return self.ffn if self.ffn is not None else 4 * self.hidden


def build_mlp(config: MLPConfig, training: bool = False) -> GraphBuilder:
    b = GraphBuilder("mlp_training" if training else "mlp", config.dtype)
    x = b.input("x", (config.batch, config.hidden), batch_dim=0)
    for layer in range(config.layers):
        p, b.layer = f"layer{layer}", layer
        h = b.op("matmul", [x, b.parameter(f"{p}.w1", (config.hidden, config.ffn_size))], f"{p}.fc1")
        a = b.op(config.activation, [h], f"{p}.act")
        x = b.op("matmul", [a, b.parameter(f"{p}.w2", (config.ffn_size, config.hidden))], f"{p}.fc2")
    b.layer = None
    if training:
        add_training_step(b, *weighted_sum_loss(b, x))
    else:
        b.mark_outputs(x)
    return b


def mlp(config: MLPConfig, training: bool = False) -> dict[str, Any]:
    """The graph document of the MLP (forward, or the whole training step)."""
    return build_mlp(config, training).document()
