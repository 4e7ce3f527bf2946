"""A stack of identical layers sampled as three: the first, one middle layer and the last.

A search over pipelines prices hundreds of configurations of one model; what a configuration's
layers cost on a stage's mesh is what the first layer (beside the embedding), any middle layer
and the last layer (beside the head and loss) cost, so three layers stand for all of them. The
sample keeps layers `order[0]`, `order[1]` and `order[-1]` (their numbers unchanged) and every op
outside the layers, and drops the rest. A kept op that read a value of a dropped layer reads the
corresponding value of the kept layer standing at the same distance on the other side of the gap:
the last layer's forward reads the middle layer's output where it read layer L - 2's, the middle
layer's backward reads the last layer's input gradient where it read layer 2's. Values correspond
by their place in the layers' canonical order (`layer_kinds.layer_part`), so every layer the gap
touches must be of the middle layers' kind.

Each kept layer then meets neighbours of the same kinds, shapes and shardings as in the whole
stack, so its ops, their reshardings and the values it keeps price alike in both: a plan of the
sample, its middle layer's shardings repeated, is a plan of the whole graph with the same per
layer prices (`represented_by` says which sample layer prices each layer of the whole).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from autoshard.errors import InputError
from autoshard.graph.layers import layer_ops
from autoshard.graph.model import Graph
from autoshard.graph.schema import graph_from_json, graph_to_json
from autoshard.planning.layer_kinds import LayerPart, layer_part
from autoshard.planning.pipeline_stages import layer_order

SAMPLED_LAYERS = 3


@dataclass(frozen=True)
class LayerSample:
    document: dict[str, Any]  # the sample's graph
    layers: tuple[int, ...]  # the whole graph's layers, in order
    represented_by: tuple[int, ...]  # per layer of the whole (in order), the sample position pricing it

    @property
    def counts(self) -> tuple[int, ...]:
        """Per sample position, how many layers of the whole it stands for."""
        return tuple(self.represented_by.count(p) for p in range(max(self.represented_by) + 1))


def layer_sample(document: dict[str, Any]) -> LayerSample:
    """The sample of the graph `document` (itself when it has at most three layers); an error
    naming `layers` when its middle layers are not all of one kind or an op outside the layers
    reads a middle layer's value."""
    graph = graph_from_json(document)
    order = layer_order(graph)
    if len(order) <= SAMPLED_LAYERS:
        return LayerSample(document, order, tuple(range(len(order))))
    ops = layer_ops(graph)
    parts = {layer: layer_part(graph, layer, ops[layer]) for layer in order}
    middle = parts[order[1]].signature
    differing = [layer for layer in order[1:-1] if parts[layer].signature != middle]
    if differing:
        raise InputError(f"layers {order[1]} to {order[-2]} are not all of one kind (layer {differing[0]} differs from "
                         f"layer {order[1]}), so no one layer prices the middle of the stack", "layers")
    dropped = set(order[2:-1])
    home = _homes(graph, [parts[layer] for layer in order[2:-1]])
    position = {layer: i for i, layer in enumerate(order)}
    shift = len(order) - SAMPLED_LAYERS  # the gap: layers 2 .. L - 2

    def substitute(tensor: str, reader: str) -> str:
        layer, index = home[tensor]
        op = graph.op_by_name[reader]
        if op.layer is None:
            raise InputError(f"op {reader!r} outside the layers reads {tensor!r} of middle layer {layer}; a sample of "
                             f"three layers needs the ops outside the layers to read the first and last only", "layers")
        before = position[layer] < position[op.layer]
        target = position[layer] - shift if before else position[layer] + shift
        if target not in (0, 1, len(order) - 1) or parts[order[target]].signature != middle:
            raise InputError(f"op {reader!r} of layer {op.layer} reads {tensor!r} of layer {layer}, across more than "
                             f"the neighbouring layer of the middle's kind; such a stack has no three-layer sample",
                             "layers")
        return parts[order[target]].tensors[index]

    kept_ops = []
    for op in graph.ops:
        if op.layer in dropped:
            continue
        inputs = tuple(substitute(t, op.name) if t in home else t for t in op.inputs)
        kept_ops.append(dataclasses.replace(op, inputs=inputs) if inputs != op.inputs else op)
    used = {t for op in kept_ops for t in op.operands}
    used |= {t for t in list(used) for t in (graph.tensors[t].updates, graph.tensors[t].grad_of) if t}
    outputs = tuple(t for t in graph.outputs if t in used)
    sample = Graph(f"{graph.name}_sample", {n: t for n, t in graph.tensors.items() if n in used}, tuple(kept_ops),
                   outputs, tuple(c for c in graph.constraints if c.tensor in used), graph.mesh_hint)
    represented = tuple(0 if i == 0 else 2 if i == len(order) - 1 else 1 for i in range(len(order)))
    return LayerSample(graph_to_json(sample), order, represented)


def _homes(graph: Graph, parts: list[LayerPart]) -> dict[str, tuple[int, int]]:
    """A dropped layer's own values (made by its ops, or stored and read by it alone) -> (its
    layer, the value's place in the layer's canonical order)."""
    home = {}
    for part in parts:
        for index, tensor in enumerate(part.tensors):
            producer = graph.producers.get(tensor)
            if (producer.layer == part.layer) if producer is not None else tensor in part.owned:
                home[tensor] = (part.layer, index)
    return home

