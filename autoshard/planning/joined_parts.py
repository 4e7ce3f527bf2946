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


def joined_problem(graph: Graph, pieces: list[Piece], uses: list[Use], prices: ReshardingPrices, weights: Weights,
                   outside: dict[tuple[str, str], tuple[PartProblem, int]] | None = None) -> Problem:
    """The pieces' problems side by side (nodes numbered piece after piece) with the edges of
    `uses` between two pieces; no memory limit. With `outside` (every whole-graph node: its part
    problem and node there), each node outside the pieces that they read from becomes a free node
    of the joined problem: its strategies are its own, at no cost, with its edges into the pieces.
    The readers of a value from outside then still pay for wanting it in different shardings (it
    is produced once, in one sharding). An edge between parts is counted by its reader's part only,
    so over a partition of the graph each edge is counted once."""
    where: dict[tuple[str, str], int] = {}  # whole-graph node -> joined node
    problems = [piece.part.problem for piece in pieces]
    starts = np.cumsum([0] + [p.num_nodes for p in problems])
    choices: list[list] = []
    for piece, start in zip(pieces, starts):
        where.update((key, start + node) for key, node in piece.nodes.items())
        choices.extend(piece.part.choices(node) for node in range(piece.part.problem.num_nodes))
    costs = [c for p in problems for c in p.node_costs]
    usages = [u for p in problems for u in p.node_usages]
    intervals = [p.intervals for p in problems]
    edges = [p.edges + start for p, start in zip(problems, starts)]
    matrices = [m for p in problems for m in p.edge_costs]
    piece_of = np.repeat(np.arange(len(pieces)), [p.num_nodes for p in problems])
    for use in uses:
        target = where.get(use.target)
        if target is None:
            continue
        source = where.get(use.source)
        if source is None:
            if outside is None or use.source not in outside:
                continue
            far_part, far_node = outside[use.source]
            source = where[use.source] = len(costs)  # the free node
            choices.append(far_part.choices(far_node))
            costs.append(np.zeros(len(choices[-1]), dtype=np.int64))
            usages.append(np.zeros(len(choices[-1]), dtype=np.int64))
            intervals.append(np.zeros((1, 2), dtype=np.int64) + (0, 1))
        elif source < starts[-1] and piece_of[source] == piece_of[target]:
            continue  # the piece's own edge
        targets = choices[target] if use.index < 0 else required_by_choice(graph, use.target[1], use.index,
                                                                           choices[target])
        matrices.append(price_table(prices, graph.tensors[use.tensor],
                                    produced_by_choice(graph, use.source, use.tensor, choices[source]), targets,
                                    weights))
        edges.append(np.array([[source, target]], dtype=np.int64))
    return Problem(tuple(costs), tuple(usages), np.concatenate(intervals).reshape(-1, 2),
                   np.concatenate(edges).reshape(-1, 2), tuple(matrices), None, graph.name)
