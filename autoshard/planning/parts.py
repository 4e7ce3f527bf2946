"""Parts of a formulated graph: some of its problem's nodes, as a problem of their own.

The whole graph is formulated once (its identical layers share their nodes' strategies, costs
and matrices, so that costs little more than one layer). A part keeps the nodes it is given and
the edges among them, with the same strategies, costs and matrices: its objective is exactly
the whole objective's share of those nodes and edges. An edge between a part and the nodes
around it becomes either a cost on the part's node, the far end's strategy being fixed
(`fixed_terms`), or an edge from a free copy of the far node (`joined`, for bounds).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

from autoshard.solver import Problem


class Parts:
    """The whole problem's edges indexed for cutting it into parts."""

    def __init__(self, whole: Problem, kinds: Sequence[Hashable]):
        self.whole = whole
        self.kinds = kinds  # per node: what identifies its strategies, costs and usages (equal nodes, equal kinds)
        self.sources, self.targets = whole.edges[:, 0], whole.edges[:, 1]

    def _local(self, nodes: Sequence[int]) -> np.ndarray:
        where = np.full(self.whole.num_nodes, -1, dtype=np.int64)
        where[np.asarray(nodes, dtype=np.int64)] = np.arange(len(nodes))
        return where

    def inner_edges(self, nodes: Sequence[int]) -> list[tuple[int, int, np.ndarray]]:
        """The edges with both ends among `nodes`, in the nodes' local numbers."""
        where = self._local(nodes)
        local_u, local_v = where[self.sources], where[self.targets]
        return [(int(local_u[e]), int(local_v[e]), self.whole.edge_costs[e])
                for e in np.flatnonzero((local_u >= 0) & (local_v >= 0))]

    def part(self, nodes: Sequence[int], usage_limit: int | None = None) -> Problem:
        """The problem on `nodes` (numbered in that order) and the edges among them."""
        whole, index = self.whole, np.asarray(nodes, dtype=np.int64)
        edges = self.inner_edges(nodes)
        return Problem(tuple(whole.node_costs[i] for i in index), tuple(whole.node_usages[i] for i in index),
                       whole.intervals[index], np.array([(u, v) for u, v, _ in edges], dtype=np.int64).reshape(-1, 2),
                       tuple(m for _, _, m in edges), usage_limit, whole.name)

    def joined(self, nodes: Sequence[int]) -> tuple[Problem, tuple]:
        """A lower-bound problem of the part on `nodes`: its own nodes and edges, and every edge
        into one of them (an edge's target end is its reader) from outside as an edge from a free
        copy of the far node, its strategies at no cost and no memory (one copy per far node, so
        readers wanting it in different strategies still pay). Any whole solution restricted to
        the part, each copy at its node's strategy, costs the part's nodes, its edges and the
        edges into it; so over parts that cover each node once, the sum of these problems' least
        costs is at most the whole optimum. No memory limit. Also a key equal for equal problems."""
        whole, index = self.whole, np.asarray(nodes, dtype=np.int64)
        edges = self.inner_edges(nodes)
        where = self._local(nodes)
        local_u, local_v = where[self.sources], where[self.targets]
        copies: dict[int, int] = {}
        for e in np.flatnonzero((local_u < 0) & (local_v >= 0)):
            far = int(self.sources[e])
            copy = copies.setdefault(far, len(index) + len(copies))
            edges.append((copy, int(local_v[e]), whole.edge_costs[e]))
        free = [np.zeros(len(whole.node_costs[far]), dtype=np.int64) for far in copies]
        problem = Problem(tuple(whole.node_costs[i] for i in index) + tuple(free),
                          tuple(whole.node_usages[i] for i in index) + tuple(free),
                          np.concatenate([whole.intervals[index], np.tile([[0, 1]], (len(copies), 1))]).astype(np.int64),
                          np.array([(u, v) for u, v, _ in edges], dtype=np.int64).reshape(-1, 2),
                          tuple(m for _, _, m in edges), None, whole.name)
        key = (tuple(self.kinds[i] for i in index), tuple(("free", self.kinds[far]) for far in copies),
               tuple((u, v, id(m)) for u, v, m in edges))
        return problem, key

    def fixed_terms(self, nodes: Sequence[int], solution: np.ndarray) -> dict[int, np.ndarray]:
        """Per local node of `nodes`, by strategy, the costs of its edges to nodes outside them at
        their strategies in `solution` (a whole solution; entries of `nodes` are not read)."""
        where = self._local(nodes)
        local_u, local_v = where[self.sources], where[self.targets]
        terms: dict[int, np.ndarray] = {}
        for e in np.flatnonzero((local_u >= 0) != (local_v >= 0)):
            matrix = self.whole.edge_costs[e]
            if local_v[e] >= 0:
                node, row = int(local_v[e]), matrix[int(solution[self.sources[e]]), :]
            else:
                node, row = int(local_u[e]), matrix[:, int(solution[self.targets[e]])]
            terms[node] = terms[node] + row if node in terms else row.astype(np.int64)
        return terms


def with_terms(problem: Problem, unary: dict[int, np.ndarray], edges: list[tuple[int, int, np.ndarray]],
               usage_limit: int | None) -> Problem:
    """`problem` with costs added to some nodes' strategies and some edges added."""
    costs = tuple(c + unary[i] if i in unary else c for i, c in enumerate(problem.node_costs))
    pairs = np.concatenate([problem.edges, np.array([(u, v) for u, v, _ in edges], dtype=np.int64).reshape(-1, 2)])
    return Problem(costs, problem.node_usages, problem.intervals, pairs,
                   problem.edge_costs + tuple(m for _, _, m in edges), usage_limit, problem.name)
