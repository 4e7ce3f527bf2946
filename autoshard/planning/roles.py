"""What each mesh axis and each tensor is for, in the words of parallel training.

Tensor roles come from the graph's data flow alone (`tensor_roles`):

- `parameter`: a stored parameter that some forward op reads, and its in-place new value;
- `optimizer_state`: a stored parameter no forward op reads (Adam's moments), and its new value;
- `gradient`: a value declared a parameter's gradient (`grad_of`), and the parts summed into it
  (backward values of the parameter's shape that only feed its gradient: every backward value
  ends in gradients, so data flow alone would call them all gradients);
- `activation`: the rest: the graph's inputs (the batch, labels, the optimizer's scalars), the
  forward and backward values, and the optimizer's temporaries (values it computes once per step
  and drops).

Axis roles come from a plan, through labels on tensor dims (`dim_labels`), each found by one seed
and propagated through the ops' indexing maps (a loop that indexes a labelled dim labels every
dim it indexes, the way a split of that loop splits them):

- `batch`: the `batch_dim` an input declares;
- `expert`: a parameter's dim indexed by a parallel loop of a contraction that indexes every
  operand (the expert dim of `batch_matmul` expert weights);
- `sequence`: the query and key sequence dims of every `attention` op, so the [B, S, ...] dims of
  a transformer's activations (and the sequence dim of position tables).

A dim keeps the first label it gets, in that order. An axis splitting an op's loop acts, at that
op, as `data` (a batch loop), `expert` (an expert loop), `context` (a sequence loop: context
parallelism in attention, sequence parallelism around it) or `tensor` (any other loop: a
parameter's or a model dim split at use). `data` becomes `fully_sharded_data` where the op uses a
parameter (reads it, or computes its gradient) that is stored split over the axis: the axis splits
the parameter's storage and the batch of its users, so the parameter is gathered before use
(FSDP, ZeRO-3). In the optimizer, a split of an expert dim is `expert` when the axis splits the
experts at the parameter's users (expert parallelism); a split of any other dim, or of an expert
dim over an axis the experts are not split over at their use, is `fully_sharded_data` when the axis
splits the batch at the parameter's users (the update and the state are split over data replicas,
ZeRO) and `tensor` otherwise. `pipeline` is in the vocabulary for stages over an
axis; no plan has them yet. Without a declared batch dim no axis can be told to be data: its splits
read as tensor.

Roles are reported per op class (`op_classes`): `optimizer` (the optimizer phase), `experts` (ops
with an expert loop), `embedding`, `attention` and `dense` (contractions: the linear layers and
their gradients) by op kind, a gradient op taking its forward kind's class; `other` for the rest
(norms, activations, residuals, reshapes, losses).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any, Mapping

from autoshard.graph.model import Graph, Op
from autoshard.ops.loops import PARALLEL, REDUCTION, LoopNest, loop_position
from autoshard.planning.costs import tensor_bytes
from autoshard.planning.plan import Plan

TENSOR_ROLES = ("parameter", "gradient", "optimizer_state", "activation")
AXIS_ROLES = ("data", "fully_sharded_data", "tensor", "context", "expert", "pipeline")
OP_CLASSES = ("embedding", "attention", "dense", "experts", "other", "optimizer")
DIM_LABELS = ("batch", "expert", "sequence")  # in the order a dim takes them

_ROLE_OF_LABEL = {"batch": "data", "expert": "expert", "sequence": "context", None: "tensor"}
_CLASS_OF_KIND = {"embedding": "embedding", "attention": "attention",
                  "matmul": "dense", "batch_matmul": "dense", "dot_general": "dense"}
_SEQUENCE_LOOPS = {"attention": (2, 4)}  # queries s and keys t (`ops/nn.py`)

Links = tuple[tuple[tuple[int, int], ...], ...]  # per loop of a nest: the (operand index, dim) it splits


def tensor_roles(graph: Graph) -> dict[str, str]:
    """Tensor name -> its role (`TENSOR_ROLES`)."""
    phases = graph.phases
    read_forward = {t for op in graph.ops if phases[op.name] == "forward" for t in op.inputs}
    roles = dict.fromkeys(graph.tensors, "activation")
    for t in graph.tensors_with_role("parameter"):
        role = "parameter" if t.name in read_forward else "optimizer_state"
        roles[t.name] = role
        if t.name in graph.updated_by:
            roles[graph.updated_by[t.name]] = role
    for name in _gradient_values(graph, phases):
        roles[name] = "gradient"
    return roles


def _gradient_values(graph: Graph, phases: Mapping[str, str]) -> dict[str, set[str]]:
    """Gradient value -> the parameters whose gradient it is or a part of."""
    found: dict[str, set[str]] = {g: {p} for p, g in graph.gradients.items()}
    for op in reversed(graph.order):
        if phases[op.name] != "backward":
            continue
        for t in op.outputs:
            users = graph.consumers[t]
            if t in found or not users or any(phases[u.name] != "backward" for u in users):
                continue
            owners = [found.get(out) for u in users for out in u.outputs]
            # every backward value ends in gradients; a part of one also has its parameter's shape
            shape = graph.tensors[t].shape
            if all(owners) and all(graph.tensors[p].shape == shape for p in set().union(*owners)):
                found[t] = set().union(*owners)
    return found


def _links(nest: LoopNest, cache: dict[LoopNest, Links]) -> Links:
    """Per loop, the (operand index, dim) pairs a split of the loop splits."""
    found = cache.get(nest)
    if found is None:
        found = cache[nest] = tuple(
            tuple((i, dim) for i, m in enumerate(nest.maps)
                  if (dim := loop_position(m, loop, nest.extents)) is not None and dim >= 0)
            for loop in range(nest.num_loops))
    return found


def dim_labels(graph: Graph) -> dict[str, list[str | None]]:
    """Tensor name -> a label (`DIM_LABELS`) or None per dim."""
    labels: dict[str, list[str | None]] = {name: [None] * len(t.shape) for name, t in graph.tensors.items()}
    cache: dict[LoopNest, Links] = {}  # repeated layers share nests
    for label in DIM_LABELS:
        seeds = _seeds(graph, label, cache)
        for name, dim in seeds:
            if labels[name][dim] is None:
                labels[name][dim] = label
        _propagate(graph, labels, label, {n for n, _ in seeds}, cache)
    return labels


def _seeds(graph: Graph, label: str, cache: dict[LoopNest, Links]) -> list[tuple[str, int]]:
    """The (tensor, dim) pairs that carry `label` before propagation."""
    if label == "batch":
        return [(t.name, t.batch_dim) for t in graph.tensors.values() if t.batch_dim is not None]
    found = []
    for op in graph.ops:
        if label == "sequence":
            for loop in _SEQUENCE_LOOPS.get(op.kind, ()):
                found += [(op.operands[i], dim) for i, dim in _links(op.nest, cache)[loop]]
        elif REDUCTION in op.nest.iterator_types:
            links = _links(op.nest, cache)
            for loop, linked in enumerate(links):
                if op.nest.iterator_types[loop] != PARALLEL or len(linked) != len(op.operands):
                    continue
                found += [(op.operands[i], dim) for i, dim in linked
                          if graph.tensors[op.operands[i]].role == "parameter"]
    return found


def _propagate(graph: Graph, labels: dict[str, list[str | None]], label: str, changed: set[str],
               cache: dict[LoopNest, Links]) -> None:
    """Spread `label` from the dims that carry it to every dim a loop links them with."""
    position = {op.name: i for i, op in enumerate(graph.ops)}
    queued = {position[op.name] for t in changed for op in _touching(graph, t)}
    pending = sorted(queued)  # a heap: ops in document order, each queued once at a time
    while pending:
        index = heapq.heappop(pending)
        queued.discard(index)
        op = graph.ops[index]
        for linked in _links(op.nest, cache):
            if not any(labels[op.operands[i]][dim] == label for i, dim in linked):
                continue
            for i, dim in linked:
                name = op.operands[i]
                if labels[name][dim] is None:
                    labels[name][dim] = label
                    for other in _touching(graph, name):
                        if position[other.name] not in queued:
                            queued.add(position[other.name])
                            heapq.heappush(pending, position[other.name])


def _touching(graph: Graph, tensor: str) -> list[Op]:
    producer = graph.producers.get(tensor)
    return graph.consumers[tensor] + ([producer] if producer else [])


def op_classes(graph: Graph, labels: Mapping[str, list[str | None]] | None = None) -> dict[str, str]:
    """Op name -> its class (`OP_CLASSES`)."""
    labels = labels if labels is not None else dim_labels(graph)
    phases = graph.phases
    out = {}
    for op in graph.ops:
        kind = op.attrs.get("of", op.kind) if op.kind == "grad" else op.kind
        if phases[op.name] == "optimizer":
            out[op.name] = "optimizer"
        elif any(labels[t][d] == "expert" for t in op.operands for d in range(len(labels[t]))):
            out[op.name] = "experts"
        else:
            out[op.name] = _CLASS_OF_KIND.get(kind, "other")
    return out


@dataclass(frozen=True)
class Roles:
    """A plan's roles: per tensor, per op its class and the role of each axis splitting it."""

    tensors: Mapping[str, str]  # tensor -> role
    classes: Mapping[str, str]  # op -> class
    ops: Mapping[str, Mapping[str, str]]  # op -> mesh axis -> role, for the axes splitting one of its loops
    batch_declared: bool  # whether any input declares its batch dim (else no axis reads as data)

    def axes(self, axis_names: tuple[str, ...]) -> dict[str, dict[str, list[str]]]:
        """Mesh axis -> role -> the op classes where the axis acts so, in vocabulary order."""
        found: dict[str, dict[str, set[str]]] = {a: {} for a in axis_names}
        for op, per_axis in self.ops.items():
            for axis, role in per_axis.items():
                found[axis].setdefault(role, set()).add(self.classes[op])
        return {a: {role: [c for c in OP_CLASSES if c in found[a][role]] for role in AXIS_ROLES if role in found[a]}
                for a in axis_names}


def plan_roles(plan: Plan) -> Roles:
    """Every tensor's role and, per op, the role of each mesh axis that splits it."""
    graph = plan.graph
    labels = dim_labels(graph)
    classes = op_classes(graph, labels)
    roles = tensor_roles(graph)
    phases = graph.phases
    gradients = _gradient_values(graph, phases)
    owned = _optimizer_parameters(graph, phases)
    cache: dict[LoopNest, Links] = {}  # repeated layers share nests

    def loop_label(op: Op, loop: int) -> str | None:
        found = (labels[op.operands[i]][dim] for i, dim in _links(op.nest, cache)[loop])
        return next((label for label in found if label is not None), None)

    def split_labels(op: Op) -> list[tuple[str, str | None]]:
        option = plan.options[op.name]
        return [(axis, loop_label(op, loop)) for loop in option.split_loops() for axis in option.loop_axes[loop]]

    # parameter -> the axes splitting the batch (the expert loop) at the ops that use it (forward and backward)
    data_axes: dict[str, set[str]] = {}
    expert_axes: dict[str, set[str]] = {}
    uses: dict[str, set[str]] = {}
    for op in graph.ops:
        if classes[op.name] == "optimizer":
            continue
        params = {t for t in op.inputs if roles[t] == "parameter"}
        params.update(p for t in op.outputs for p in gradients.get(t, ()))
        uses[op.name] = params
        splits = split_labels(op)
        batch_axes = {axis for axis, label in splits if label == "batch"}
        routed_axes = {axis for axis, label in splits if label == "expert"}
        for p in params:
            data_axes.setdefault(p, set()).update(batch_axes)
            expert_axes.setdefault(p, set()).update(routed_axes)
    stored_split = {p: set(plan.storage[p].used_axes()) for p in data_axes}

    per_op: dict[str, dict[str, str]] = {}
    for op in graph.ops:
        found: dict[str, str] = {}
        for axis, label in split_labels(op):
            role = _ROLE_OF_LABEL[label]
            params = owned.get(op.name, ())
            if classes[op.name] == "optimizer" and not (
                    label == "expert" and any(axis in expert_axes.get(p, ()) for p in params)):
                # the optimizer splits a parameter's own dims: data replicas or tensor shards (a
                # position table's sequence dim is a parameter dim here; an expert dim is the
                # expert axis's only where the experts are split over it at their use, else its
                # split is the optimizer's over data replicas, ZeRO)
                data = any(axis in data_axes.get(p, ()) for p in params)
                role = "fully_sharded_data" if data else "tensor"
            elif role == "data" and any(axis in stored_split[p] for p in uses[op.name]):
                role = "fully_sharded_data"  # stored split over a batch axis of this use: gathered for it
            found[axis] = role
        per_op[op.name] = found
    batch_declared = any(t.batch_dim is not None for t in graph.tensors.values())
    return Roles(roles, classes, per_op, batch_declared)


def _optimizer_parameters(graph: Graph, phases: Mapping[str, str]) -> dict[str, set[str]]:
    """Optimizer op -> the parameters whose gradients reach it."""
    reach: dict[str, set[str]] = {g: {p} for p, g in graph.gradients.items()}
    out: dict[str, set[str]] = {}
    for op in graph.order:
        if phases[op.name] != "optimizer":
            continue
        params = set().union(*(reach.get(t, set()) for t in op.inputs))
        out[op.name] = params
        for t in op.outputs:
            reach[t] = params
    return out


def roles_document(plan: Plan, roles: Roles | None = None) -> dict[str, Any]:
    """plan.json's `roles`: per mesh axis its roles with the op classes where each holds; per
    tensor role how many tensors, their bytes and the bytes one device holds of them (state once,
    as stored: an in-place new value takes its old value's storage; gradients and activations as
    produced, summed over the step, not a peak); and the role of every tensor that is not an
    activation."""
    roles = roles if roles is not None else plan_roles(plan)
    graph, mesh = plan.graph, plan.mesh
    totals = {role: {"tensors": 0, "bytes": 0, "bytes_per_device": 0} for role in TENSOR_ROLES}
    in_place = set(graph.updated_by.values())
    for name, role in roles.tensors.items():
        if name in in_place:
            continue
        t = graph.tensors[name]
        entry = totals[role]
        entry["tensors"] += 1
        entry["bytes"] += t.bytes
        entry["bytes_per_device"] += tensor_bytes(t.shape, t.itemsize, plan.produced(name), mesh)
    document = {
        "axes": roles.axes(mesh.axis_names),
        "tensors": totals,
        "tensor_roles": {name: role for name, role in roles.tensors.items() if role != "activation"},
        "batch_declared": roles.batch_declared,
    }
    from autoshard.planning.sequence_layout import sequence_layout  # it reads the labels defined here
    layout = sequence_layout(plan)
    if layout is not None:
        document["sequence_layout"] = layout
    return document

