"""Model generators: graph documents of MLPs, GPT/LLaMA transformers, MoE layers and U-Nets, forward or
a whole training step, built op by op with shapes from the op table.

May import: the vocabulary, `ops`, `graph`.
"""

from autoshard.graph.builder import GraphBuilder
from autoshard.models.gpt import GPTConfig, build_gpt, gpt
from autoshard.models.mlp import MLPConfig, build_mlp, mlp
from autoshard.models.moe import MoEConfig, build_moe, moe
from autoshard.models.unet import UNetConfig, build_unet, unet

__all__ = ["GraphBuilder", "GPTConfig", "MLPConfig", "MoEConfig", "UNetConfig", "build_gpt", "build_mlp", "build_moe",
           "build_unet", "gpt", "mlp", "moe", "unet"]
