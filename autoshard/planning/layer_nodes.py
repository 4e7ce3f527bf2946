"""A graph's layers as nodes of its formulation, grouped into kinds that are one problem.

A layer's nodes are its ops, the stored tensors only it reads and the delivered nodes of the
values it produces or stores, in canonical order (its ops in order, then its tensors in
`LayerPart.tensors` order): the i-th nodes of two layers of one kind correspond. Layers of one
structural kind (`layer_kinds`) are of one problem kind when their nodes have the same
strategies, costs and usages and the same edges among them with the same matrices. That can
fail where the structure cannot see: a value's delivered node offers the shardings its readers
share, and the readers of the last layer's output are outside every layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoshard.planning.formulation import Formulation
from autoshard.planning.layer_kinds import LayerKind, LayerPart
from autoshard.planning.parts import Parts


@dataclass(frozen=True)
class LayerNodes:
    part: LayerPart
    nodes: np.ndarray  # whole-problem node numbers, canonical order: ops first, in `part.ops` order
    fingerprint: tuple  # equal for layers whose nodes form the same problem

    @property
    def layer(self) -> int:
        return self.part.layer


@dataclass(frozen=True)
class Kind:
    signature: str  # the structural hash (`LayerPart.signature`)
    layers: tuple[LayerNodes, ...]  # in layer order; layers[0] is the representative

    @property
    def numbers(self) -> tuple[int, ...]:
        return tuple(layer.layer for layer in self.layers)


def layer_nodes(formulation: Formulation, parts: Parts, part: LayerPart,
                index: dict[tuple[str, str], int]) -> LayerNodes:
    """`part`'s nodes in `formulation` (`index`: node key -> number)."""
    graph, members = formulation.graph, set(part.ops)
    keys = [("op", name) for name in part.ops] + [("storage", t) for t in part.tensors if t in part.owned]
    for t in part.tensors:
        producer = graph.producers.get(t)
        if ("delivered", t) in index and (t in part.owned or (producer is not None and producer.name in members)):
            keys.append(("delivered", t))
    nodes = np.array([index[key] for key in keys], dtype=np.int64)
    inner = tuple((u, v, id(m)) for u, v, m in parts.inner_edges(nodes))
    return LayerNodes(part, nodes, (tuple(parts.kinds[i] for i in nodes), inner))


def problem_kinds(formulation: Formulation, parts: Parts, kinds: list[LayerKind]) -> list[Kind]:
    """The layers of each structural kind split by fingerprint, kinds in order of their first layer."""
    index = {key: i for i, key in enumerate(formulation.nodes)}
    found: dict[tuple, list[LayerNodes]] = {}
    for kind in kinds:
        for part in kind.parts:
            nodes = layer_nodes(formulation, parts, part, index)
            found.setdefault((kind.signature, nodes.fingerprint), []).append(nodes)
    return sorted((Kind(signature, tuple(layers)) for (signature, _), layers in found.items()),
                  key=lambda kind: kind.layers[0].layer)
