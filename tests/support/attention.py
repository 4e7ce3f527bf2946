"""Inputs and storage for the attention graphs the context-parallel tests plan."""

from __future__ import annotations

import numpy as np

from autoshard.graph.schema import graph_from_json
from autoshard.models import GraphBuilder
from autoshard.sharding import Sharding


def attention_inputs(graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Random q, k, v and mask, the mask keeping key 0 for every query so no row is all masked."""
    rng = np.random.default_rng(seed)
    found = {n: rng.standard_normal(graph.tensors[n].shape) for n in "qkv"}
    if "mask" in graph.tensors:
        mask = graph.tensors["mask"]
        found["mask"] = rng.random(mask.shape) < 0.6 if mask.dtype == "bool" else rng.standard_normal(mask.shape)
        if mask.dtype == "bool":
            found["mask"][..., 0] = True
    return found


def stored_whole(graph) -> dict[str, Sharding]:
    """Every value the graph stores (inputs, parameters) held whole on every device."""
    return {t.name: Sharding() for t in graph.tensors.values() if t.role != "intermediate"}


def attention_gradient_graph(name: str, shapes: tuple, causal: bool, mask: str | None = None):
    """Attention's gradients with respect to q, k, v (and an added float mask) of q, k, v shaped
    `shapes` ([B, H, S, d], [B, H, T, d], [B, H, T, e]), a mask broadcast over the batch."""
    q_shape, k_shape, v_shape = shapes
    b = GraphBuilder(name, "f32")
    inputs = [b.input(n, s) for n, s in zip("qkv", shapes)]
    if mask is not None:
        inputs.append(b.input("mask", (q_shape[1], q_shape[2], k_shape[2]), mask))
    dy = b.input("dy", (*q_shape[:3], v_shape[3]))
    wrts = (0, 1, 2, 3) if mask == "f32" else (0, 1, 2)
    b.mark_outputs(*(b.op("grad", [*inputs, dy], f"d{'qkvm'[w]}", of="attention", wrt=w, forward={"causal": causal})
                     for w in wrts))
    return graph_from_json(b.document())
