"""Reference evaluator: run a whole graph in numpy on the unsharded tensors."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from autoshard.dtypes import DTYPES
from autoshard.errors import InputError
from autoshard.graph.model import Graph, Op, topological_order
from autoshard.ops import evaluate

# Ops that move a mask's elements without computing new ones (a cast only changes their type): a
# drawn input reaching an attention's bool mask through them keeps its meaning as a mask.
MASK_MOVES = frozenset({"reshape", "broadcast_in_dim", "transpose", "slice", "reverse", "cast"})


def random_inputs(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Random values for every input and parameter, of the declared shapes and dtypes; an input
    whose contents the graph carries (an imported program's constant) gets them instead.

    Floats are drawn in [-1, 1); integers in [0, n) where n is the smallest table an embedding
    looks them up in (so every id is valid), else [0, 8). An input that an attention's bool mask
    is moved from (an opaque op's mask, a padding mask argument) is drawn as a valid mask: at
    random, but keeping the first key of every row, which a causal mask keeps too. A row masked
    everywhere would make the attention's softmax 0 / 0, NaN in the reference and on every device.
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
        if tensor.value is not None:
            values[tensor.name] = np.asarray(tensor.value, dt.numpy).reshape(tensor.shape)
        elif dt.is_float:
            values[tensor.name] = rng.uniform(-1.0, 1.0, tensor.shape).astype(dt.numpy)
        elif tensor.dtype == "bool":
            values[tensor.name] = rng.integers(0, 2, tensor.shape).astype(bool)
        else:
            values[tensor.name] = rng.integers(0, bounds.get(tensor.name, 8), tensor.shape).astype(dt.numpy)
    for name, moves, scores in mask_sources(graph):
        values[name] = keep_first_keys(values[name], moves, scores)
    return values


def mask_sources(graph: Graph) -> list[tuple[str, list[Op], tuple[int, ...]]]:
    """For each attention whose bool mask is moved from a drawn input of the graph (through
    `MASK_MOVES` only): the input, the ops from it to the mask in order, and the attention's scores
    shape [B, H, S, T]. A mask whose contents the graph carries is the program's own, kept as it is."""
    producers, sources = graph.producers, []
    for op in graph.ops:
        if op.kind != "attention" or len(op.inputs) != 4 or graph.tensors[op.inputs[3]].dtype != "bool":
            continue
        moves, tensor = [], op.inputs[3]
        while tensor in producers and producers[tensor].kind in MASK_MOVES:
            moves.append(producers[tensor])
            tensor = producers[tensor].inputs[0]
        if graph.tensors[tensor].role == "input" and graph.tensors[tensor].value is None:
            (b, h, s, _), t = graph.tensors[op.inputs[0]].shape, graph.tensors[op.inputs[1]].shape[2]
            sources.append((tensor, moves[::-1], (b, h, s, t)))
    return sources


def keep_first_keys(value: np.ndarray, moves: list[Op], scores: tuple[int, ...]) -> np.ndarray:
    """`value` with the elements that become the mask's first key (of every row of `scores`, once
    `moves` run and the mask broadcasts) set to true, or to 1 for an integer cast to bool."""
    # each element's flat index, moved as the mask is, names the element every mask position reads
    index = np.arange(value.size).reshape(value.shape)
    for op in moves:
        if op.kind != "cast":
            (index,) = evaluate(op.op_kind, op.nest, op.attrs, [index])
    kept = value.copy()
    kept.reshape(-1)[np.unique(np.broadcast_to(index, scores)[..., 0])] = 1
    return kept


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
