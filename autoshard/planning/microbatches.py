"""A step run as M microbatches: forward and backward once per microbatch on 1/M of the batch,
the parameters' gradients accumulated across them, and the optimizer once per step.

The graph says where the batch is (`batch_dim` on inputs); the label is carried through every
op's indexing maps (`planning.roles.dim_labels`) to every dim that holds part of the batch. The
step on one microbatch is the same graph with those dims divided by M (a `shape` attribute
follows its op's result), so every op keeps its name, loops and options. Each op runs `repeats`
times per step: M in the forward and backward phases, once in the optimizer's. A value that the
optimizer reads from the microbatch part is a gradient, accumulated in `ACCUMULATION_DTYPE` over
the microbatches (float gradients narrower than it are widened); its reduction across data
replicas is priced where the optimizer reads it, so it happens once per step, after the last
microbatch. Accumulators live for the whole step: from the first microbatch's backward they are
held while later microbatches run.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping

import numpy as np

from autoshard.dtypes import DTYPES
from autoshard.errors import InputError, Problem
from autoshard.graph.model import Graph
from autoshard.graph.schema import graph_from_json, graph_to_json
from autoshard.mesh import Mesh
from autoshard.planning.costs import tensor_bytes
from autoshard.planning.formulation import DELIVER, Formulation
from autoshard.planning.options import result_shardings
from autoshard.planning.roles import dim_labels
from autoshard.sharding import Sharding
from autoshard.solver.problem import FORBIDDEN_COST, Problem as SolverProblem

ACCUMULATION_DTYPE = "f32"


@dataclass(frozen=True)
class Microbatching:
    count: int
    whole: Graph  # the step on the whole batch, as given
    graph: Graph  # the step on one microbatch
    repeats: Mapping[str, int]  # op -> times it runs per step
    accumulated: Mapping[str, int]  # gradient value -> bytes its accumulator holds per byte of the value


def microbatch(graph: Graph, count: int) -> Microbatching:
    """The step split into `count` microbatches; `count` 1 is the step as given."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise InputError(f"the number of microbatches must be a positive integer, got {count!r}", "microbatches")
    phases = graph.phases
    repeats = {op.name: 1 if phases[op.name] == "optimizer" else count for op in graph.ops}
    if count == 1:
        return Microbatching(1, graph, graph, repeats, {})
    crossing = _crossing(graph, phases)
    batched = [t for t in graph.tensors.values() if t.batch_dim is not None]
    if not batched:
        raise InputError("the graph declares no batch dim (`batch_dim` on an input), so the step cannot be split "
                         "into microbatches", "microbatches")
    problems = [Problem(f"/tensors/{t.name}/batch_dim", f"input {t.name!r} has a batch of {t.shape[t.batch_dim]}, "
                                                        f"which {count} microbatches do not divide")
                for t in batched if t.shape[t.batch_dim] % count]
    if problems:
        raise InputError(problems)
    labels = dim_labels(graph)
    problems = [Problem(f"/tensors/{name}", f"value {name!r} is read once per step by the optimizer but is not a "
                                            f"declared gradient (`grad_of`), so it has no accumulation across "
                                            f"microbatches") for name in crossing if graph.tensors[name].grad_of is None]
    state = {t.name for t in graph.tensors_with_role("parameter")} | set(graph.gradients.values()) | set(graph.updated_by.values())
    problems += [Problem(f"/tensors/{name}", f"{name!r} is a parameter, gradient or new state but one of its dims "
                                             f"carries the batch") for name in sorted(state)
                 if "batch" in labels[name]]
    if problems:
        raise InputError(problems)
    accumulated = {g: _accumulator_ratio(graph.tensors[g].dtype) for g in crossing}
    return Microbatching(count, graph, _divided(graph, labels, count), repeats, accumulated)


def _crossing(graph: Graph, phases: Mapping[str, str]) -> list[str]:
    """Values the optimizer reads from the forward and backward ops, in the order first read."""
    found: dict[str, None] = {}
    for op in graph.order:
        if phases[op.name] == "optimizer":
            for t in op.inputs:
                maker = graph.producers.get(t)
                if maker is not None and phases[maker.name] != "optimizer":
                    found[t] = None
    return list(found)


def _accumulator_ratio(dtype: str) -> int:
    """Accumulator bytes per byte of a gradient of `dtype`: a float narrower than the
    accumulation dtype is widened (a bf16 gradient accumulates in f32: 2)."""
    info, wide = DTYPES[dtype], DTYPES[ACCUMULATION_DTYPE]
    return wide.itemsize // info.itemsize if info.is_float and info.itemsize < wide.itemsize else 1


def _divided(graph: Graph, labels: Mapping[str, list[str | None]], count: int) -> Graph:
    """`graph` with every dim labelled `batch` divided by `count`."""
    document = graph_to_json(graph)
    problems = []
    for name, entry in document["tensors"].items():
        for dim, (size, label) in enumerate(zip(entry["shape"], labels[name])):
            if label == "batch" and size % count:
                problems.append(Problem(f"/tensors/{name}/shape/{dim}", f"{name!r} carries the batch in dim {dim} "
                                                                       f"of size {size}, which {count} microbatches do not divide"))
        entry["shape"] = [size // count if label == "batch" else size for size, label in zip(entry["shape"], labels[name])]
    if problems:
        raise InputError(problems)
    for op in document["ops"]:
        if "shape" in op and op["outputs"]:
            op["shape"] = list(document["tensors"][op["outputs"][0]]["shape"])
        if op["kind"] == "slice" and "limits" in op:  # one keeping a batch dim whole keeps it whole
            source = graph.tensors[op["inputs"][0]]  # (q, k and v split off one projection)
            starts = op.get("starts", [0] * len(source.shape))
            op["limits"] = [size // count if label == "batch" and (start, limit) == (0, size) else limit
                            for size, start, limit, label in zip(source.shape, starts, op["limits"],
                                                                 labels[source.name])]
    try:
        return graph_from_json(document)
    except InputError as error:
        raise InputError([Problem(p.where, f"on one of {count} microbatches: {p.message}") for p in error.problems]) from None


def _edge_runs(microbatching: Microbatching, consumer: str, input_index: int) -> int:
    """Times per step a resharding read by `consumer` is made: as often as the consumer runs (a
    value's delivery, `DELIVER`, as often as its first reader); a value stored back in place
    (`WRITE_BACK`) or delivered as an output is made as often as its producer runs (`consumer`
    is then the overwritten value or `output`)."""
    return microbatching.repeats.get(consumer, 1) if input_index >= 0 or input_index == DELIVER else 1


def repeat_formulation(formulation: Formulation, microbatching: Microbatching) -> Formulation:
    """`formulation` of the step on one microbatch, priced for the whole step: op nodes and the
    edges into them cost as often as the op runs; a gradient's producer holds its accumulator, in
    the accumulation dtype, from the start of the step."""
    if microbatching.count == 1:
        return formulation
    graph, mesh, problem = formulation.graph, formulation.mesh, formulation.problem
    costs, usages = list(problem.node_costs), list(problem.node_usages)
    intervals = np.array(problem.intervals)
    for i, (kind, name) in enumerate(formulation.nodes):
        if kind != "op":
            continue
        costs[i] = _times(costs[i], microbatching.repeats[name])
        op = graph.op_by_name[name]
        extra = [(position, t) for position, t in enumerate(op.outputs) if t in microbatching.accumulated]
        if extra:
            added = np.array([sum((microbatching.accumulated[t] - 1) * _held(graph, t, result_shardings(op.nest, option)[p], mesh)
                                  for p, t in extra) for option in formulation.choices[i]], dtype=np.int64)
            usages[i] = usages[i] + added
            intervals[i, 0] = 0
    edge_costs = [_times(matrix, _edge_runs(microbatching, consumer, index))
                  for matrix, (_, consumer, index) in zip(problem.edge_costs, formulation.uses)]
    repeated = SolverProblem(tuple(costs), tuple(usages), intervals, problem.edges, tuple(edge_costs),
                             problem.usage_limit, problem.name)
    return replace(formulation, problem=repeated)


def _times(costs: np.ndarray, runs: int) -> np.ndarray:
    """Costs of something done `runs` times; a forbidden choice stays forbidden, not larger."""
    if runs == 1:
        return costs
    allowed = costs < FORBIDDEN_COST
    if np.any(np.abs(costs[allowed]) >= 2.0 ** 62 / runs):
        raise InputError(f"a cost repeated over {runs} microbatches is beyond the 2**62 picoseconds the objective "
                         f"can count; use fewer microbatches or shrink the weights", "microbatches")
    return np.where(allowed, costs * runs, costs)


def _held(graph: Graph, tensor: str, sharding: Sharding, mesh: Mesh) -> int:
    t = graph.tensors[tensor]
    return tensor_bytes(t.shape, t.itemsize, sharding, mesh)


def stated_microbatches(document: object, given: int | None = None) -> int:
    """The number of microbatches a plan document was made for (`microbatches`, default 1), or
    `given` when a caller asks to price it with another."""
    if given is not None:
        if isinstance(given, bool) or not isinstance(given, int) or given < 1:
            raise InputError(f"must be a positive integer, got {given!r}", "microbatches")
        return given
    stated = document.get("microbatches", 1) if isinstance(document, dict) else 1
    if isinstance(stated, bool) or not isinstance(stated, int) or stated < 1:
        raise InputError(f"expected a positive integer, got {stated!r}", "/microbatches")
    return stated
