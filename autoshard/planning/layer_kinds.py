"""Layer kinds: a graph's layers grouped by a structural hash.

Two layers are of one kind when their ops are the same up to names: the same op kinds, loop
nests, attributes and tensor shapes, dtypes and roles, wired the same way, in the same
topological order. A layer here is every op that declares it (`Op.layer`): its forward ops, the
backward ops that inherit it and the optimizer ops of its parameters. Its *owned* stored tensors
are the inputs and parameters only its ops read (its weights and optimizer moments); every other
value it reads comes across its boundary. Tensors are numbered in order of first appearance
through the layer's ops, so the i-th op and the i-th tensor of two layers of one kind correspond.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Sequence

from autoshard.graph.layers import layer_ops
from autoshard.graph.model import Graph


@dataclass(frozen=True)
class LayerPart:
    layer: int
    ops: tuple[str, ...]  # in topological order
    tensors: tuple[str, ...]  # every tensor the ops touch (and the values they overwrite), in canonical order
    owned: frozenset[str]  # stored tensors only this layer's ops read
    signature: str


@dataclass(frozen=True)
class LayerKind:
    signature: str
    parts: tuple[LayerPart, ...]  # in layer order; parts[0] is the representative

    @property
    def layers(self) -> tuple[int, ...]:
        return tuple(part.layer for part in self.parts)


def layer_part(graph: Graph, layer: int, ops: Sequence[str]) -> LayerPart:
    """The layer made of `ops` (names, in topological order), with its structural hash."""
    members = set(ops)
    tensors: dict[str, int] = {}
    for name in ops:
        op = graph.op_by_name[name]
        for t in op.operands:
            tensors.setdefault(t, len(tensors))
            old = graph.tensors[t].updates
            if old is not None:
                tensors.setdefault(old, len(tensors))
    owned = frozenset(t for t in tensors if graph.tensors[t].role != "intermediate"
                      and all(c.name in members for c in graph.consumers[t]))
    pins = {c.tensor: (c.sharding, c.required) for c in graph.constraints}
    outputs = set(graph.outputs)

    def where(t: str) -> str:
        producer = graph.producers.get(t)
        if producer is not None:
            return "produced" if producer.name in members else "boundary"
        return "owned" if t in owned else "boundary"

    def describe(t: str) -> tuple:
        tensor = graph.tensors[t]
        escapes = t in outputs or any(c.name not in members for c in graph.consumers[t])
        return (tensor.shape, tensor.dtype, tensor.role, where(t), escapes, tensor.batch_dim,
                tensors.get(tensor.updates, "outside") if tensor.updates else None,
                tensors.get(tensor.grad_of, "outside") if tensor.grad_of else None, str(pins.get(t)))

    structure = (
        [describe(t) for t in tensors],
        [(graph.op_by_name[n].kind, repr(graph.op_by_name[n].nest), _canonical(graph.op_by_name[n].attrs),
          [tensors[t] for t in graph.op_by_name[n].inputs], [tensors[t] for t in graph.op_by_name[n].outputs])
         for n in ops],
    )
    digest = hashlib.sha256(repr(structure).encode()).hexdigest()[:16]
    return LayerPart(layer, tuple(ops), tuple(tensors), owned, digest)


def layer_kinds(graph: Graph) -> list[LayerKind]:
    """The graph's layers grouped by signature, kinds in order of their first layer."""
    groups: dict[str, list[LayerPart]] = {}
    for layer, ops in layer_ops(graph).items():
        part = layer_part(graph, layer, ops)
        groups.setdefault(part.signature, []).append(part)
    return [LayerKind(signature, tuple(parts)) for signature, parts in groups.items()]


def _canonical(attrs: Any) -> str:
    """Attributes as text that does not depend on key order."""
    return json.dumps(attrs, sort_keys=True, default=repr)
