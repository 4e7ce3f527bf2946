"""What a plan costs: per op compute, every resharding with its collectives, per-axis traffic,
per-device peak memory and when it peaks.

Step time is compute plus communication with no overlap assumed (an upper bound on a real
step; it is also what the solver minimises). Beside it, the step with the communication that can
run behind compute hidden (`overlap`: a parameter's gradient reduction and all_gather), at most
the additive one. Memory counts each value from the step that
produces it to its last use, parameters for the whole step.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping

import numpy as np

from autoshard.graph.model import Op, live_ranges, topological_order
from autoshard.ops.loops import LoopNest
from autoshard.planning.costs import Hardware, OpCost, device_flops, op_cost, tensor_bytes
from autoshard.planning.options import ShardingOption, operand_shardings, result_shardings
from autoshard.planning.overlap import DESCRIPTION, Overlap, OverlapTally, hideable
from autoshard.planning.plan import Plan
from autoshard.planning.roles import tensor_roles
from autoshard.resharding import PricedMoves, Resharding, plan_resharding, step_kind
from autoshard.sharding import Sharding

if TYPE_CHECKING:
    from autoshard.planning.microbatches import Microbatching


@dataclass
class Report:
    ops: list[dict[str, Any]] = field(default_factory=list)
    reshardings: list[dict[str, Any]] = field(default_factory=list)
    compute_s: float = 0.0
    communication_s: float = 0.0
    communication_bytes: float = 0.0
    bytes_per_axis: dict[str, float] = field(default_factory=dict)
    seconds_per_axis: dict[str, float] = field(default_factory=dict)
    peak_memory_bytes: int = 0
    peak_step: int = 0
    peak_op: str = ""
    parameter_bytes: int = 0
    activation_peak_bytes: int = 0
    overlap: Overlap = field(default_factory=lambda: Overlap(0.0, 0.0, 0.0, 0.0, {}, {}))
    # per op, the hideable seconds of the reshardings into it (its `communication_s`'s share)
    hideable_s_per_op: dict[str, float] = field(default_factory=dict)

    @property
    def step_s(self) -> float:
        return self.compute_s + self.communication_s

    def to_json(self) -> dict[str, Any]:
        return {
            "totals": {
                "step_s": self.step_s, "compute_s": self.compute_s, "communication_s": self.communication_s,
                "communication_bytes": self.communication_bytes, "overlap": DESCRIPTION,
                "overlapped_step_s": self.overlap.step_s, "hideable_s": self.overlap.hideable_s,
                "hidden_s": self.overlap.hidden_s, "exposed_s": self.overlap.exposed_s,
                "communication_bytes_per_axis": self.bytes_per_axis,
                "communication_s_per_axis": self.seconds_per_axis,
                "hidden_s_per_axis": self.overlap.hidden_s_per_axis,
                "exposed_s_per_axis": self.overlap.exposed_s_per_axis,
                "peak_memory_bytes_per_device": self.peak_memory_bytes,
                "peak_at": {"step": self.peak_step, "op": self.peak_op},
                "parameter_bytes_per_device": self.parameter_bytes,
                "activation_bytes_at_peak_per_device": self.activation_peak_bytes,
            },
            "ops": self.ops,
            "reshardings": self.reshardings,
        }


@dataclass(frozen=True)
class PlanShardings:
    """A plan's ops in topological order, each value's sharding as produced (or stored) and each
    op's input shardings, derived once per op (`Plan.produced` / `Plan.required` derive every
    operand of the op on each call, which adds up over tens of thousands of ops)."""

    order: list[Op]
    produced: dict[str, Sharding]
    required: dict[str, tuple[Sharding, ...]]

    @classmethod
    def of(cls, plan: Plan) -> "PlanShardings":
        order = topological_order(plan.graph)
        produced: dict[str, Sharding] = {}
        required: dict[str, tuple[Sharding, ...]] = {}
        derived: dict[tuple[LoopNest, ShardingOption], tuple[tuple[Sharding, ...], tuple[Sharding, ...]]] = {}
        for op in order:
            key = (op.nest, plan.options[op.name])
            if key not in derived:  # repeated layers share nests and options
                derived[key] = result_shardings(*key), operand_shardings(*key)
            results, required[op.name] = derived[key]
            produced.update(zip(op.outputs, results))
        produced.update(plan.storage)  # a stored value is held as stored, as in `Plan.produced`
        return cls(order, produced, required)


def delivered_shardings(plan: Plan, price: Callable[[str, tuple[str, ...], float], float],
                        shardings: PlanShardings | None = None,
                        search: Callable[[str, Sharding, Sharding], Resharding] | None = None) -> dict[str, Sharding]:
    """Each value read by several uses, and the sharding it is delivered in: resharded once to
    it from where it is produced, every use then reading from it (`plan_reshardings`).

    The delivered sharding is the value as produced or one that two uses read, whichever makes
    the value's reshardings the fewest seconds (the first of equals): a weight gathered for its
    forward and backward matmuls is gathered once. The formulation prices the same rule, with
    a delivered node per such value (`autoshard.planning.formulation`); so does the program."""
    shardings = shardings if shardings is not None else PlanShardings.of(plan)
    search = search if search is not None else _searcher(plan, price)
    reads: dict[str, list[Sharding]] = defaultdict(list)
    for op in shardings.order:
        for t, target in zip(op.inputs, shardings.required[op.name]):
            reads[t].append(target)
    out = {}
    for t, targets in reads.items():
        if len(targets) < 2:
            continue
        source = shardings.produced[t]
        counts: dict[Sharding, int] = defaultdict(int)
        for target in targets:
            counts[target] += 1
        candidates = [source] + [target for target, count in counts.items() if count >= 2 and target != source]

        def seconds(via: Sharding) -> float:
            into = search(t, source, via).seconds if via != source else 0.0
            return into + sum(search(t, via, target).seconds for target in targets if target != via)

        out[t] = min(candidates, key=seconds) if len(candidates) > 1 else source
    return out


def _searcher(plan: Plan, price: Callable[[str, tuple[str, ...], float], float]
              ) -> Callable[[str, Sharding, Sharding], Resharding]:
    """`plan_resharding` of a tensor between two shardings; each (shape, itemsize, source,
    target) searched once, as a graph's identical layers ask for the same ones."""
    graph, mesh = plan.graph, plan.mesh
    moves = PricedMoves(price)
    found: dict[tuple[tuple[int, ...], int, Sharding, Sharding], Resharding] = {}

    def search(t: str, source: Sharding, target: Sharding) -> Resharding:
        tensor = graph.tensors[t]
        key = (tensor.shape, tensor.itemsize, source, target)
        if key not in found:
            found[key] = plan_resharding(mesh, tensor.shape, tensor.itemsize, source, target, price, moves)
        return found[key]

    return search


def plan_reshardings(plan: Plan, price: Callable[[str, tuple[str, ...], float], float],
                     shardings: PlanShardings | None = None) -> list[tuple[str, str, int | None, Resharding]]:
    """Every resharding the plan needs: (tensor, consumer op or "output", input index, steps).

    A value read by several uses is resharded once to its delivered sharding
    (`delivered_shardings`), listed at its first use; each use reading another sharding is
    resharded from the delivered one on its own, and each graph output from the value as
    produced: what the formulation prices and the partitioned program runs.
    """
    graph = plan.graph
    shardings = shardings if shardings is not None else PlanShardings.of(plan)
    search = _searcher(plan, price)
    delivered = delivered_shardings(plan, price, shardings, search)
    out = []
    made: set[str] = set()  # values already delivered
    for op in shardings.order:
        for i, (t, target) in enumerate(zip(op.inputs, shardings.required[op.name])):
            source = shardings.produced[t]
            via = delivered.get(t, source)
            if via != source and t not in made:
                made.add(t)
                out.append((t, op.name, i, search(t, source, via)))
            if via != target:
                out.append((t, op.name, i, search(t, via, target)))
    for t in graph.outputs:
        source, target = shardings.produced[t], plan.final(t)
        if source != target:
            out.append((t, "output", None, search(t, source, target)))
    return out


def estimate(plan: Plan, hw: Hardware, microbatching: Microbatching | None = None, step_lists: bool = True) -> Report:
    """What `plan` costs on `hw`. With `microbatching`, `plan` is of the step on one microbatch:
    each op and each resharding into it count as often as the op runs per step (a value delivered
    as an output, as often as its producer), and gradients hold their accumulators. Without
    `step_lists` each resharding's `steps` is left empty (a search reading only the prices: a
    permute over hundreds of devices lists millions of transfers)."""
    graph, mesh = plan.graph, plan.mesh
    report = Report()
    shardings = PlanShardings.of(plan)
    runs = microbatching.repeats if microbatching is not None else {}
    count = microbatching.count if microbatching is not None else 1
    roles, phases, tally = tensor_roles(graph), graph.phases, OverlapTally()
    costs: dict[tuple, OpCost] = {}
    for op in shardings.order:
        option = plan.options[op.name]
        # `op_cost` reads the op through its nest, busiest device's FLOPs and operands' shapes,
        # dtypes and fusion only (the first input's dtype, or the first result's if it has none):
        # repeated layers are priced once
        key = (op.nest, option, device_flops(op, option, mesh), len(op.inputs),
               tuple((graph.tensors[t].shape, graph.tensors[t].dtype, t in graph.fused) for t in op.operands))
        if key not in costs:
            costs[key] = op_cost(graph, op, option, mesh, hw)
        cost, times = costs[key], runs.get(op.name, 1)
        report.compute_s += cost.seconds * times
        if phases[op.name] == "backward":
            tally.last_backward_s += cost.seconds * times / count
        report.ops.append({"op": op.name, "kind": op.kind, "option": option.to_json(),
                           **({"ring": option.ring} if option.ring is not None else {}), "compute_s": cost.seconds * times,
                           "flops_per_device": cost.flops * times, "bytes_per_device": cost.bytes * times,
                           "bound": cost.bound, "communication_s": 0.0, "communication_bytes": 0.0,
                           **({"runs": times} if microbatching is not None else {})})
    by_name = {entry["op"]: entry for entry in report.ops}
    per_axis_bytes: dict[str, float] = defaultdict(float)
    per_axis_s: dict[str, float] = defaultdict(float)
    # Identical layers share their reshardings (`plan_reshardings` searches each once), and so
    # their entries share one list of steps, written once: a permute on 32 devices lists about
    # a thousand transfers. The lists are read only.
    steps_json: dict[int, list[dict[str, Any]]] = {}
    for tensor, consumer, index, resharding in plan_reshardings(plan, hw.collective_seconds, shardings):
        steps = steps_json.get(id(resharding))
        if steps is None:
            steps = steps_json[id(resharding)] = [s.to_json() for s in resharding.steps] if step_lists else []
        # made as often as its consumer runs; an output as often as its producer
        maker = graph.producers.get(tensor)
        times = runs.get(consumer if consumer in runs else maker.name if maker is not None else "", 1)
        seconds, moved = resharding.seconds * times, sum(_communicated(s) for s in resharding.steps) * times
        report.reshardings.append({"tensor": tensor, "consumer": consumer, "input": index,
                                   "from": resharding.source.to_json(), "to": resharding.target.to_json(),
                                   "steps": steps, "seconds": seconds, "bytes_per_device": moved,
                                   **({"runs": times} if microbatching is not None else {})})
        report.communication_s += seconds
        report.communication_bytes += moved
        # a gradient reduced once per step, after the last of several microbatches
        after_last = count > 1 and times == 1 and roles[tensor] == "gradient"
        hidden = 0.0
        for s in resharding.steps:
            for axis in s.mesh_axes:
                # a collective over several axes is charged to each of them
                per_axis_bytes[axis] += _communicated(s) * times
                per_axis_s[axis] += s.seconds * times
            if hideable(s.kind, roles[tensor]):
                tally.add(s.seconds * times, s.mesh_axes, after_last)
                hidden += s.seconds * times
        charged = consumer if consumer in by_name else maker.name if maker is not None else None
        if hidden and charged is not None:  # an output's reshardings are charged to its maker, as in a pipeline
            report.hideable_s_per_op[charged] = report.hideable_s_per_op.get(charged, 0.0) + hidden
        if consumer in by_name:
            by_name[consumer]["communication_s"] += seconds
            by_name[consumer]["communication_bytes"] += moved
    report.bytes_per_axis = dict(per_axis_bytes)
    report.seconds_per_axis = dict(per_axis_s)
    report.overlap = Overlap.of(tally, report.compute_s, report.communication_s, report.seconds_per_axis)
    _memory(plan, report, shardings, microbatching.accumulated if microbatching is not None else None)
    return report


def _communicated(step) -> float:
    """Bytes a step puts on the wire per device: an all_slice only keeps part of what is local."""
    return step.bytes_per_device if step_kind(step.kind).moves_data else 0.0


def memory_timeline(plan: Plan, shardings: PlanShardings | None = None,
                    accumulated: Mapping[str, int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Bytes each device holds at every step (ops in topological order), and the parameters'
    share of them: each value counts at its size as produced or stored over its `live_ranges`.
    `accumulated`: values accumulated over microbatches, with their accumulator's bytes per byte
    of the value; an accumulator is held from the start of the step.

    A running total (add a value at its first step, take it off after its last) costs values
    plus steps; adding each value into every step it is live costs their product, which a
    96-layer training step (34k values, 29k steps, parameters live throughout) takes most of a minute.
    """
    graph, mesh = plan.graph, plan.mesh
    shardings = shardings if shardings is not None else PlanShardings.of(plan)
    ranges = live_ranges(graph, shardings.order)
    produced = shardings.produced
    sizes: dict[tuple[tuple[int, ...], int, Sharding], int] = {}
    held, first, last, is_parameter = [], [], [], []
    for name, tensor in graph.tensors.items():
        key = (tensor.shape, tensor.itemsize, produced[name])
        if key not in sizes:
            sizes[key] = tensor_bytes(tensor.shape, tensor.itemsize, key[2], mesh)
        maker = graph.producers.get(name)
        held.append(0 if maker is not None and maker.op_kind.view else sizes[key])  # a view holds its input's storage
        if accumulated and name in accumulated:
            held[-1] *= accumulated[name]
            ranges[name] = (0, ranges[name][1])
        first.append(ranges[name][0])
        last.append(ranges[name][1])
        state = graph.tensors[tensor.updates] if tensor.updates is not None else tensor  # a new value holds its old one's place
        is_parameter.append(state.role == "parameter")
    steps = max(len(shardings.order), 1)
    # exact in int64: a graph holds at most 2**56 bytes (`graph.schema.MAX_GRAPH_BYTES`)
    held_a, first_a, last_a = np.array(held, np.int64), np.array(first, np.intp), np.array(last, np.intp)
    mask = np.array(is_parameter, dtype=bool)
    return (_running_total(steps, held_a, first_a, last_a),
            _running_total(steps, held_a[mask], first_a[mask], last_a[mask]))


def _running_total(steps: int, held: np.ndarray, first: np.ndarray, last: np.ndarray) -> np.ndarray:
    change = np.zeros(steps + 1, dtype=held.dtype)
    np.add.at(change, first, held)
    np.subtract.at(change, last + 1, held)
    return np.cumsum(change[:steps])


def _memory(plan: Plan, report: Report, shardings: PlanShardings, accumulated: Mapping[str, int] | None) -> None:
    order = shardings.order
    usage, params = memory_timeline(plan, shardings, accumulated)
    peak = int(np.argmax(usage))  # the first step at the peak
    report.peak_memory_bytes = int(usage[peak])
    report.peak_step = peak
    report.peak_op = order[peak].name if order else ""
    report.parameter_bytes = int(params[peak])
    report.activation_peak_bytes = int(usage[peak] - params[peak])
