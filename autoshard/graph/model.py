"""The computation graph: tensors, ops with their loop nests, constraints.

Built (and validated) from JSON by `autoshard.graph.schema`; everything else reads these frozen
types. Graph algorithms (order, live ranges, the networkx view) are plain functions.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Mapping

import networkx as nx

from autoshard.dtypes import DTYPES
from autoshard.graph.fusion import fused_values
from autoshard.ops import OP_KINDS, LoopNest, OpKind
from autoshard.sharding import Sharding



@dataclass(frozen=True, slots=True)
class Tensor:
    name: str
    shape: tuple[int, ...]
    dtype: str
    role: str = "intermediate"
    updates: str | None = None  # the input or parameter whose storage this value overwrites (in place)
    grad_of: str | None = None  # the parameter this value is the gradient of
    batch_dim: int | None = None  # the dim of an input that carries the batch (split by microbatches)
    # an input's known contents, row-major (a small constant of an imported program): evaluation uses them
    # instead of drawing the input, so ops like sqrt see the program's own numbers
    value: tuple[float | int | bool, ...] | None = None

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype].itemsize

    @property
    def bytes(self) -> int:
        return math.prod(self.shape) * self.itemsize


@dataclass(frozen=True)
class Op:
    name: str
    kind: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Mapping[str, Any]
    nest: LoopNest
    module: str = ""  # the framework module the op came from (`layers.0.attention.wq`), if imported
    layer: int | None = None  # the repeated layer the op belongs to (forward, backward or optimizer), if any

    @property
    def op_kind(self) -> OpKind:
        return OP_KINDS[self.kind]

    @property
    def operands(self) -> tuple[str, ...]:
        """Inputs then outputs, aligned with `nest.maps`."""
        return self.inputs + self.outputs

    def flops(self) -> float:
        return self.op_kind.flops(self.nest, self.attrs)


@dataclass(frozen=True, slots=True)
class Constraint:
    tensor: str
    sharding: Sharding
    required: bool = True


@dataclass(frozen=True)
class Graph:
    name: str
    tensors: Mapping[str, Tensor]
    ops: tuple[Op, ...]
    outputs: tuple[str, ...]
    constraints: tuple[Constraint, ...] = ()
    mesh_hint: str | None = field(default=None, compare=False)  # the document's own mesh, if it gives one

    @cached_property
    def producers(self) -> dict[str, Op]:
        return {t: op for op in self.ops for t in op.outputs}

    @cached_property
    def consumers(self) -> dict[str, list[Op]]:
        users: dict[str, list[Op]] = {t: [] for t in self.tensors}
        for op in self.ops:
            for t in dict.fromkeys(op.inputs):
                users[t].append(op)
        return users

    @cached_property
    def op_by_name(self) -> dict[str, Op]:
        return {op.name: op for op in self.ops}

    @cached_property
    def updated_by(self) -> dict[str, str]:
        """Input or parameter -> the value that overwrites its storage in place."""
        return {t.updates: t.name for t in self.tensors.values() if t.updates is not None}

    @cached_property
    def gradients(self) -> dict[str, str]:
        """Parameter -> its gradient (values the graph declares with `grad_of`)."""
        return {t.grad_of: t.name for t in self.tensors.values() if t.grad_of is not None}

    @cached_property
    def fused(self) -> frozenset[str]:
        """Values a compiled step computes without writing them to memory (`graph.fusion`)."""
        return fused_values(self)

    @cached_property
    def phases(self) -> dict[str, str]:
        """Op name -> what it does in a training step: `forward` (it feeds an output that is not a
        new state value), `optimizer` (it reads a parameter's gradient, or a value computed from
        one: the per-step tail that runs once after the gradients are complete), or `backward`
        (the rest)."""
        per_step: set[str] = set()
        reached = set(self.gradients.values())
        for op in self.order:
            if any(t in reached for t in op.inputs):
                per_step.add(op.name)
                reached.update(op.outputs)
        new_state = set(self.updated_by.values()) | reached
        needed = {t for t in self.outputs if t not in new_state}
        forward: set[str] = set()
        for op in reversed(self.order):
            if op.name not in per_step and any(t in needed for t in op.outputs):
                forward.add(op.name)
                needed.update(op.inputs)
        return {op.name: "optimizer" if op.name in per_step else "forward" if op.name in forward else "backward"
                for op in self.ops}

    @cached_property
    def order(self) -> tuple[Op, ...]:
        """Topological order of the ops, computed once (`topological_order`): among ready ops, the
        one listed first. An op writing a value in place runs after every other reader of the value
        it overwrites. Raises ValueError on a cycle (documents are checked for them on load)."""
        position = {op.name: index for index, op in enumerate(self.ops)}
        waiting = [0] * len(self.ops)  # per op: ops that must run before it and have not
        followers: dict[int, list[int]] = {}
        for index, op in enumerate(self.ops):
            for before in after_ops(self, op):
                waiting[index] += 1
                followers.setdefault(position[before.name], []).append(index)
        ready = [index for index, count in enumerate(waiting) if count == 0]
        heapq.heapify(ready)
        order = []
        while ready:
            index = heapq.heappop(ready)
            order.append(self.ops[index])
            for follower in followers.get(index, ()):
                waiting[follower] -= 1
                if waiting[follower] == 0:
                    heapq.heappush(ready, follower)
        if len(order) != len(self.ops):
            raise ValueError(f"graph {self.name!r} has a cycle")
        return tuple(order)

    def tensors_with_role(self, role: str) -> list[Tensor]:
        return [t for t in self.tensors.values() if t.role == role]

    def total_flops(self) -> float:
        return sum(op.flops() for op in self.ops)


def after_ops(graph: Graph, op: Op) -> list[Op]:
    """The ops `op` must run after, each once: the producers of its inputs and, where it writes a
    value in place, the other readers of the value it overwrites."""
    found = {graph.producers[t].name: graph.producers[t] for t in op.inputs if t in graph.producers}
    for t in op.outputs:
        old = graph.tensors[t].updates
        if old is not None:
            found.update((reader.name, reader) for reader in graph.consumers[old] if reader is not op)
    return list(found.values())


def to_networkx(graph: Graph) -> nx.MultiDiGraph:
    """Ops as nodes (kind, loops, iterator types, maps); one edge per tensor use, with its bytes."""
    view = nx.MultiDiGraph(name=graph.name)
    for index, op in enumerate(graph.ops):
        view.add_node(op.name, index=index, kind=op.kind, extents=op.nest.extents,
                      iterator_types=op.nest.iterator_types, maps=[str(m) for m in op.nest.maps],
                      flops=op.flops())
    for op in graph.ops:
        for t in dict.fromkeys(op.inputs):
            producer = graph.producers.get(t)
            if producer is not None:
                view.add_edge(producer.name, op.name, key=t, tensor=t, bytes=graph.tensors[t].bytes)
    return view


def topological_order(graph: Graph) -> list[Op]:
    """Deterministic order: among ready ops, the one listed first in the document."""
    return list(graph.order)


def live_ranges(graph: Graph, order: list[Op] | None = None) -> dict[str, tuple[int, int]]:
    """Steps `[first, last]` during which each tensor is held, with ops numbered in `order`.

    Parameters live for the whole step; inputs from the start; a tensor dies after its last
    consumer, and graph outputs live to the end. A view's input (`OpKind.view`) lives as long as
    the view does: the view holds its storage. A value written in place takes over the storage
    of the one it overwrites at the step it is produced: the old value is held until the step
    before, the new one from then on, so the storage is counted once.
    """
    order = order if order is not None else topological_order(graph)
    end = max(len(order) - 1, 0)
    step = {op.name: i for i, op in enumerate(order)}
    outputs = set(graph.outputs)  # a training step returns thousands of values
    ranges = {}
    for name, tensor in graph.tensors.items():
        producer = graph.producers.get(name)
        first = step[producer.name] if producer else 0
        if tensor.role == "parameter" or name in outputs:
            last = end
        else:
            last = max((step[op.name] for op in graph.consumers[name]), default=first)
        ranges[name] = (first, last)
    for old, new in graph.updated_by.items():
        ranges[old] = (ranges[old][0], ranges[new][0] - 1)
    for op in reversed(order):  # a view of a view is extended first
        if op.op_kind.view:
            source, (first, last) = op.inputs[0], ranges[op.inputs[0]]
            ranges[source] = (first, max(last, ranges[op.outputs[0]][1]))
    return ranges
