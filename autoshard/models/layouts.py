"""Hand-set layouts of a generated transformer's training step, as graph constraints: fully-sharded
data parallel (every matrix, its Adam moments and master weight split on dim 0 over `dp`) or Megatron's tensor
parallel (column-parallel projections split on their output dim over `tp`, row-parallel ones on
their input dim); the batch over `dp` either way. Everything else is left to the solver. And the
whole of Megatron-LM's layout of its own layer (`megatron_constraints`), values included."""

from __future__ import annotations

from typing import Any

COLUMN = (".q.w", ".k.w", ".v.w", ".gate.w", ".up.w", "lm_head.w")  # split the output dim
ROW = (".out.w", ".down.w")  # split the input dim
LAYOUTS = ("fsdp", "tp")


def layout_constraints(document: dict[str, Any], batch: int, layout: str) -> list[dict[str, Any]]:
    """Required shardings of `document`'s matrices, their moments and its batch-sized inputs."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; expected one of {LAYOUTS}")
    constraints = []
    for name, tensor in document["tensors"].items():
        shape, role = tensor["shape"], tensor.get("role")
        weight = name.removeprefix("adam.").removesuffix(".m").removesuffix(".v").removesuffix(".master")
        if role == "parameter" and len(shape) == 2:
            axes = ([["dp"], []] if layout == "fsdp" else [[], ["tp"]] if weight.endswith(COLUMN)
                    else [["tp"], []] if weight.endswith(ROW) else [[], []])
            constraints.append({"tensor": name, "split_axes": axes, "required": True})
        elif role == "input" and shape and shape[0] == batch:
            constraints.append({"tensor": name, "split_axes": [["dp"]] + [[]] * (len(shape) - 1), "required": True})
    return constraints


def layer_style(document: dict[str, Any]) -> str:
    """Which generator's layer a step has, by its value names: "megatron" (Megatron-LM's own
    layer, attention unfused), "gpt" (fused attention with biases and layer norms) or "llama"."""
    names = document["tensors"]
    if not any(name.endswith(".attn.sdpa") for name in names):
        return "megatron"
    return "gpt" if any(name.endswith(".attn.q.b") for name in names) else "llama"


# Megatron-LM's tensor parallelism of its GPT layer (`generate gpt --style megatron`): heads and the
# MLP's features split over tp, by the layer's value names; norms, residuals and the masks beside
# them whole, or split on the sequence with sequence parallelism.
MEGATRON_HEAD_SPLIT = ("attn.q.heads", "attn.k.heads", "attn.v.heads", "attn.softmax", "attn.attn_dropout.kept",
                       "attn.attn_dropout", "attn.attn_dropout.mask")
MEGATRON_FEATURE_SPLIT = ("attn.merged", "mlp.fc1", "mlp.gelu")
MEGATRON_SEQUENCE = ("attn_norm", "mlp_norm", "attn_residual", "mlp_residual", "attn.out_dropout.mask",
                     "mlp.dropout.mask")
MEGATRON_COLUMN, MEGATRON_ROW = ("attn.q.w", "attn.k.w", "attn.v.w", "mlp.fc1.w"), ("attn.out.w", "mlp.fc2.w")


def megatron_constraints(document: dict[str, Any], sequence_parallel: bool, data_parallel: bool = False, *,
                         tensor_axes: tuple[str, ...] = ("tp",), data_axes: tuple[str, ...] = ("dp",)
                         ) -> list[dict[str, Any]]:
    """Required shardings of a Megatron-style step's layer values and matrices over `tensor_axes` (the
    embedding's output with the norms, as layer 0's input); with `data_parallel`, the batch dim
    of those values and of the step's batch inputs over `data_axes` too."""
    batch = [list(data_axes)] if data_parallel else [[]]
    tensor = list(tensor_axes)
    constraints = []
    for name, tensor_json in document["tensors"].items():
        local, rank = name.split(".", 1)[-1], len(tensor_json["shape"])
        if local.endswith(MEGATRON_HEAD_SPLIT):
            axes = batch + [tensor] + [[]] * (rank - 2)
        elif local.endswith(MEGATRON_FEATURE_SPLIT):
            axes = batch + [[]] * (rank - 2) + [tensor]
        elif local.endswith(MEGATRON_COLUMN):
            axes = [[], tensor]
        elif local.endswith(MEGATRON_ROW):
            axes = [tensor, []]
        elif (local.endswith(MEGATRON_SEQUENCE) and name.startswith("layer")) or name == "embed.position_add":
            axes = batch + ([tensor, []] if sequence_parallel else [[]] * (rank - 1))
        elif data_parallel and tensor_json.get("role") == "input" and tensor_json.get("batch_dim") == 0:
            axes = batch + [[]] * (rank - 1)
        else:
            continue
        constraints.append({"tensor": name, "split_axes": axes, "required": True})
    return constraints
