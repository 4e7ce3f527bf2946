"""Parts of a graph joined into one problem: each part's own nodes and edges, plus the edges of
the whole formulation that run between them.

A layer's part problem stands for every layer of its kind: a piece is a part problem with the
whole-graph nodes it stands for this time (layer j's ops and owned tensors, mapped to the
representative's nodes by canonical position). The edges between pieces are priced as the whole
formulation prices them, from the strategies at both ends, so the joined problem is exactly the
whole objective's share of the pieces' nodes and of every edge among them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoshard.graph.model import Graph
from autoshard.planning.formulation import ReshardingPrices, Weights
from autoshard.planning.layer_kinds import LayerPart
from autoshard.planning.parts import PartProblem, price_table, produced_by_choice, required_by_choice
from autoshard.solver import Problem


@dataclass(frozen=True)
class Use:
    """One edge of the whole formulation: `tensor` from `source` (an op, or a stored tensor) into
    `target` (an op's input `index`, or with index -1 the stored tensor it is written back into)."""

    tensor: str
    source: tuple[str, str]  # ("op", name) or ("storage", tensor)
    target: tuple[str, str]
    index: int


@dataclass(frozen=True)
class Piece:
    part: PartProblem
    nodes: dict[tuple[str, str], int]  # whole-graph node -> node of `part.problem`


def uses_of(graph: Graph) -> list[Use]:
    """The whole formulation's edges: one per use of a tensor, one per value written back in place
    (unless pinned: a pinned new value is returned as pinned instead)."""
    pins = {c.tensor for c in graph.constraints if c.required}
    found = []
    for op in graph.ops:
        for index, t in enumerate(op.inputs):
            producer = graph.producers.get(t)
            source = ("op", producer.name) if producer is not None else ("storage", t)
            found.append(Use(t, source, ("op", op.name), index))
    for old, new in graph.updated_by.items():
        if new not in pins:
            found.append(Use(new, ("op", graph.producers[new].name), ("storage", old), -1))
    return found


def layer_piece(part: PartProblem, representative: LayerPart, layer: LayerPart) -> Piece:
    """`layer` standing on its kind's part problem (solved on `representative`)."""
    nodes = {("op", name): part.node_of[("op", rep)] for name, rep in zip(layer.ops, representative.ops)}
    nodes.update((("storage", t), part.node_of[("storage", rep)])
                 for t, rep in zip(layer.tensors, representative.tensors) if t in layer.owned)
    return Piece(part, nodes)


def joined_problem(graph: Graph, pieces: list[Piece], uses: list[Use], prices: ReshardingPrices,
                   weights: Weights) -> Problem:
    """The pieces' problems side by side (nodes numbered piece after piece) with the edges of
    `uses` between two pieces; no memory limit."""
    where: dict[tuple[str, str], tuple[int, int]] = {}  # whole-graph node -> (piece, joined node)
    offset = 0
    for index, piece in enumerate(pieces):
        where.update((key, (index, offset + node)) for key, node in piece.nodes.items())
        offset += piece.part.problem.num_nodes
    starts = np.cumsum([0] + [p.part.problem.num_nodes for p in pieces])
    edges = [piece.part.problem.edges + start for piece, start in zip(pieces, starts)]
    matrices = [m for piece in pieces for m in piece.part.problem.edge_costs]
    for use in uses:
        source, target = where.get(use.source), where.get(use.target)
        if source is None or target is None or source[0] == target[0]:
            continue
        source_choices = pieces[source[0]].part.choices(source[1] - starts[source[0]])
        target_choices = pieces[target[0]].part.choices(target[1] - starts[target[0]])
        targets = target_choices if use.index < 0 else required_by_choice(graph, use.target[1], use.index,
                                                                          target_choices)
        matrices.append(price_table(prices, graph.tensors[use.tensor],
                                    produced_by_choice(graph, use.source, use.tensor, source_choices), targets,
                                    weights))
        edges.append(np.array([[source[1], target[1]]], dtype=np.int64))
    problems = [piece.part.problem for piece in pieces]
    return Problem(tuple(c for p in problems for c in p.node_costs), tuple(u for p in problems for u in p.node_usages),
                   np.concatenate([p.intervals for p in problems]).reshape(-1, 2),
                   np.concatenate(edges).reshape(-1, 2), tuple(matrices), None, graph.name)
