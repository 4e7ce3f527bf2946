"""A pipelined step's memory as the solver sees it: one time step per pipeline stage.

The stage plan is one plan of the whole graph on a stage's mesh. Its memory rows follow the
whole graph's live ranges, which hold one microbatch of every layer, where a stage holds its own
layers' state and the activations of every microbatch it has in flight: a budget on the whole
graph can only be shrunk until the fullest stage fits, which bends every layer's shardings for
the first stage's sake. Once the cut is known, each stage's peak as `price_pipeline` counts it is
a sum over the problem's nodes, so the problem is given a timeline of S steps instead:

- a parameter or optimizer state (a storage node) is live at the stages whose ops read it;
- a gradient's producer (its accumulator) is live at its stage;
- a value saved for the backward (made by a forward op, or a batch input, and read by a backward
  op) is live at the stages of the parts that read it, its usage times the most microbatches of
  their chunks a stage holds at once (`chunk_inflight`; over the stages with fewer, an excess);
- every other value (the transients inside one F, B or W, the optimizer's results written back
  in place) weighs nothing, as `price_pipeline` leaves them out too.

The usage limit is one stage's budget, so a solution that fits here fits every stage: the model
bounds each stage's peak from above (exactly, with one chunk a stage and no value saved across a
boundary).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping

import numpy as np

from autoshard.pipeline import StageOrders
from autoshard.pipeline.schedules import chunk_inflight
from autoshard.planning.costs import tensor_bytes
from autoshard.planning.formulation import Formulation
from autoshard.planning.options import result_shardings
from autoshard.planning.roles import tensor_roles
from autoshard.solver.problem import Problem

HELD_ROLES = ("parameter", "optimizer_state")


def staged_formulation(formulation: Formulation, part_of: Mapping[str, int], kinds: Mapping[str, str],
                       orders: StageOrders, budget_bytes: float) -> Formulation:
    """`formulation` with its memory on the stages' timeline; `part_of` (op -> virtual stage)
    and `kinds` (`work_kinds`) are of the formulation's graph."""
    graph, problem = formulation.graph, formulation.problem
    inflight = chunk_inflight(orders)
    roles = tensor_roles(graph)
    saved_by: dict[str, set[int]] = {}  # value -> the parts whose backward reads it
    for op in graph.ops:
        if kinds[op.name] not in ("B", "W"):
            continue
        for t in op.inputs:
            maker = graph.producers.get(t)
            if (maker is not None and kinds[maker.name] == "F") or (maker is None and graph.tensors[t].batch_dim
                                                                     is not None):
                saved_by.setdefault(t, set()).add(part_of[op.name])
    usages, intervals = [], []
    for (kind, name), usage in zip(formulation.nodes, problem.node_usages):
        weight, stages = 0.0, (0, 0)
        held = (name,) if kind == "storage" else graph.op_by_name[name].outputs if kind == "op" else ()
        saved = [orders.placement(part) for t in held for part in saved_by.get(t, ())]
        if saved and (kind == "storage" or kinds[name] == "F"):
            # a value saved by several parts (a boundary activation, read by the backward on both
            # sides) is held by each: one interval over their stages, at the most in flight
            weight = max(float(inflight[stage, chunk]) for stage, chunk in saved)
            stages = (min(stage for stage, _ in saved), max(stage for stage, _ in saved))
            # at its bytes as produced, as `price_pipeline` counts it (the formulation counts a
            # view of a value it already holds at nothing)
            usage = _saved_bytes(formulation, len(usages), [t for t in held if t in saved_by])
        elif kind == "storage" and roles[name] in HELD_ROLES and graph.consumers[name]:
            readers = [orders.placement(part_of[r.name])[0] for r in graph.consumers[name]]
            weight, stages = 1.0, (min(readers), max(readers))
        elif kind == "op" and any(graph.tensors[t].grad_of is not None for t in held):
            stage = orders.placement(part_of[name])[0]
            weight, stages = 1.0, (stage, stage)
        usages.append(np.round(usage * weight).astype(np.int64))
        intervals.append((stages[0], stages[1] + 1))
    staged = Problem(problem.node_costs, tuple(usages), np.array(intervals, dtype=np.int64).reshape(-1, 2),
                     problem.edges, problem.edge_costs, int(budget_bytes), problem.name)
    return replace(formulation, problem=staged)


def _saved_bytes(formulation: Formulation, node: int, saved: list[str]) -> np.ndarray:
    """Per strategy of `node`, the bytes per device of its values in `saved`, as produced."""
    graph, mesh = formulation.graph, formulation.mesh
    kind, name = formulation.nodes[node]
    out = np.zeros(len(formulation.choices[node]), dtype=np.int64)
    for strategy, choice in enumerate(formulation.choices[node]):
        if kind == "storage":
            produced = {name: choice}
        else:
            op = graph.op_by_name[name]
            produced = dict(zip(op.outputs, result_shardings(op.nest, choice)))
        out[strategy] = sum(tensor_bytes(graph.tensors[t].shape, graph.tensors[t].itemsize, produced[t], mesh)
                            for t in saved)
    return out
