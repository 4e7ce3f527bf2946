"""A part of a graph (a layer's ops, or the ops outside every layer) as a problem of its own.

The part's ops become a graph whose values from outside the part are inputs, formulated as any
graph is; `PartProblem.problem` keeps only the part's own nodes (its ops and the stored tensors
only it reads) and the edges between them. Each kept node has the strategies, costs and memory
it has in the whole graph's formulation (a node's costs depend on its op, shapes, pins and
whether it returns a graph output, all the same in the part), so the part's objective is exactly
the whole objective's share of these nodes and edges. The edges that cross the part's boundary
are priced apart, from both sides' shardings. Parts are formulated with every use priced on its
own edge (`delivered_nodes=False`): a value read by several uses is not given one delivered
sharding, so a composed objective is that of the whole graph formulated the same way.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from autoshard.graph.model import Graph, Tensor
from autoshard.mesh import Mesh
from autoshard.planning.costs import Hardware
from autoshard.planning.formulation import PICOSECONDS, Formulation, ReshardingPrices, Weights, formulate
from autoshard.planning.options import operand_shardings, result_shardings
from autoshard.sharding import Sharding
from autoshard.solver import Problem


@dataclass
class PartProblem:
    formulation: Formulation  # of the part's graph
    problem: Problem  # the part's own nodes and the edges between them; no memory limit
    kept: list[int]  # per problem node: its node in `formulation`
    node_of: dict[tuple[str, str], int]  # ("op", name) or ("storage", owned tensor) -> its problem node

    def choices(self, node: int) -> list:
        return self.formulation.choices[self.kept[node]]


def part_graph(graph: Graph, ops: Sequence[str], tensors: Sequence[str]) -> Graph:
    """The graph of `ops`: `tensors` (every one they touch) with those produced outside the part
    turned into inputs; its outputs are the whole graph's outputs the part produces."""
    members = set(ops)
    produced = {t for name in ops for t in graph.op_by_name[name].outputs}
    kept: dict[str, Tensor] = {}
    for t in tensors:
        tensor = graph.tensors[t]
        if tensor.role == "intermediate" and t not in produced:
            tensor = dataclasses.replace(tensor, role="input", updates=None, grad_of=None)
        kept[t] = tensor
    outputs = tuple(t for t in graph.outputs if t in produced)
    constraints = tuple(c for c in graph.constraints if c.tensor in kept)
    return Graph(f"{graph.name}[{len(members)} ops]", kept, tuple(graph.op_by_name[n] for n in ops), outputs,
                 constraints)


def part_problem(graph: Graph, ops: Sequence[str], tensors: Sequence[str], owned: frozenset[str], mesh: Mesh,
                 hw: Hardware, weights: Weights, mesh_order: bool) -> PartProblem:
    """Formulate the part of `ops` (reading `tensors`; `owned`: the stored tensors only it reads)."""
    # use by use, as `joined_parts.uses_of` mirrors the edges
    formulation = formulate(part_graph(graph, ops, tensors), mesh, hw, weights=weights, mesh_order=mesh_order,
                            delivered_nodes=False)
    kept = [i for i, (kind, name) in enumerate(formulation.nodes) if kind == "op" or name in owned]
    return PartProblem(formulation, restricted(formulation.problem, kept, None), kept,
                       {formulation.nodes[i]: n for n, i in enumerate(kept)})


def restricted(problem: Problem, kept: list[int], usage_limit: int | None) -> Problem:
    """The problem on nodes `kept` (renumbered in that order) and the edges between them."""
    new = {old: n for n, old in enumerate(kept)}
    edges = [(new[u], new[v], m) for (u, v), m in zip(problem.edges.tolist(), problem.edge_costs)
             if u in new and v in new]
    return Problem(tuple(problem.node_costs[i] for i in kept), tuple(problem.node_usages[i] for i in kept),
                   problem.intervals[kept], np.array([(u, v) for u, v, _ in edges], dtype=np.int64).reshape(-1, 2),
                   tuple(m for _, _, m in edges), usage_limit, problem.name)


def with_terms(problem: Problem, unary: dict[int, np.ndarray], edges: list[tuple[int, int, np.ndarray]],
               usage_limit: int | None) -> Problem:
    """`problem` with costs added to some nodes' strategies and some edges added."""
    costs = tuple(c + unary[i] if i in unary else c for i, c in enumerate(problem.node_costs))
    pairs = np.concatenate([problem.edges, np.array([(u, v) for u, v, _ in edges], dtype=np.int64).reshape(-1, 2)])
    return Problem(costs, problem.node_usages, problem.intervals, pairs,
                   problem.edge_costs + tuple(m for _, _, m in edges), usage_limit, problem.name)


def picoseconds(seconds: np.ndarray, comm_bytes: np.ndarray, weights: Weights) -> np.ndarray:
    """A resharding's price as the formulation's edges weigh it (integer picoseconds of objective,
    the terms in the formulation's order, so the rounding agrees)."""
    return np.round(np.asarray(seconds, np.float64) * PICOSECONDS * weights.time
                    + np.asarray(comm_bytes, np.float64) * PICOSECONDS * weights.comm_s_per_byte).astype(np.int64)


def price_table(prices: ReshardingPrices, tensor: Tensor, sources: list[Sharding], targets: list[Sharding],
                weights: Weights) -> np.ndarray:
    """|sources| x |targets| resharding prices, each distinct pair searched once."""
    src: dict[Sharding, int] = {}
    dst: dict[Sharding, int] = {}
    rows = np.array([src.setdefault(s, len(src)) for s in sources])
    cols = np.array([dst.setdefault(d, len(dst)) for d in targets])
    seconds, comm = prices.table(tensor.shape, tensor.itemsize, list(src), list(dst))
    return picoseconds(seconds, comm, weights)[rows[:, None], cols[None, :]]


def produced_by_choice(graph: Graph, node: tuple[str, str], tensor: str, choices: list) -> list[Sharding]:
    """Per strategy of `node` (("op", name) or ("storage", tensor)), the sharding it gives `tensor`."""
    if node[0] == "storage":
        return list(choices)
    op = graph.op_by_name[node[1]]
    position = op.outputs.index(tensor)
    return [result_shardings(op.nest, option)[position] for option in choices]


def required_by_choice(graph: Graph, op_name: str, index: int, choices: list) -> list[Sharding]:
    """Per option of op `op_name`, the sharding it reads its input `index` in."""
    op = graph.op_by_name[op_name]
    return [operand_shardings(op.nest, option)[index] for option in choices]
