"""Hand-set layouts of a generated transformer's training step, as graph constraints: fully-sharded
data parallel (every matrix, its Adam moments and master weight split on dim 0 over `dp`) or Megatron's tensor
parallel (column-parallel projections split on their output dim over `tp`, row-parallel ones on
their input dim); the batch over `dp` either way. Everything else is left to the solver."""

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
