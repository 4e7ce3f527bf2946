"""Reference evaluator: run a whole graph in numpy on the unsharded tensors."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from autoshard.dtypes import DTYPES
from autoshard.errors import InputError
from autoshard.graph.model import Graph, topological_order
from autoshard.ops import evaluate


def random_inputs(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Random values for every input and parameter, of the declared shapes and dtypes.

    Floats are drawn in [-1, 1); integers in [0, n) where n is the smallest table an embedding
    looks them up in (so every id is valid), else [0, 8).
    """
    rng = np.random.default_rng(seed)
    bounds: dict[str, int] = {}
    for op in graph.ops:
        if op.kind == "embedding":
            ids, table = op.inputs
            bounds[ids] = min(bounds.get(ids, graph.tensors[table].shape[0]), graph.tensors[table].shape[0])
    values = {}
    for tensor in graph.tensors.values():
        if tensor.role == "intermediate":
            continue
        dt = DTYPES[tensor.dtype]
        if dt.is_float:
            values[tensor.name] = rng.uniform(-1.0, 1.0, tensor.shape).astype(dt.numpy)
        elif tensor.dtype == "bool":
            values[tensor.name] = rng.integers(0, 2, tensor.shape).astype(bool)
        else:
            values[tensor.name] = rng.integers(0, bounds.get(tensor.name, 8), tensor.shape).astype(dt.numpy)
    return values


def evaluate_graph(graph: Graph, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every tensor's value, computing ops in topological order."""
    values = dict(inputs)
    missing = [t.name for t in graph.tensors.values() if t.role != "intermediate" and t.name not in values]
    if missing:
        raise InputError(f"no value given for {missing}", "inputs")
    for op in topological_order(graph):
        results = evaluate(op.op_kind, op.nest, op.attrs, [values[t] for t in op.inputs])
        for name, value in zip(op.outputs, results):
            values[name] = np.asarray(value).astype(DTYPES[graph.tensors[name].dtype].numpy, copy=False)
    return values
