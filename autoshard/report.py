"""What a plan costs: per op compute, every resharding with its collectives, per-axis traffic,
per-device peak memory and when it peaks.

Step time is compute plus communication with no overlap assumed (an upper bound on a real
step; it is also what the solver minimises). Memory counts each value from the step that
produces it to its last use, parameters for the whole step.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable

from autoshard.costs import Hardware, op_cost, tensor_bytes
from autoshard.graph import live_ranges, topological_order
from autoshard.plan import Plan
from autoshard.resharding import Resharding, plan_resharding
from autoshard.sharding import Sharding


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

    @property
    def step_s(self) -> float:
        return self.compute_s + self.communication_s

    def to_json(self) -> dict[str, Any]:
        return {
            "totals": {
                "step_s": self.step_s, "compute_s": self.compute_s, "communication_s": self.communication_s,
                "communication_bytes": self.communication_bytes, "overlap": "none (compute + communication)",
                "communication_bytes_per_axis": self.bytes_per_axis,
                "communication_s_per_axis": self.seconds_per_axis,
                "peak_memory_bytes_per_device": self.peak_memory_bytes,
                "peak_at": {"step": self.peak_step, "op": self.peak_op},
                "parameter_bytes_per_device": self.parameter_bytes,
                "activation_bytes_at_peak_per_device": self.activation_peak_bytes,
            },
            "ops": self.ops,
            "reshardings": self.reshardings,
        }


def plan_reshardings(plan: Plan, price: Callable[[str, tuple[str, ...], float], float]) -> list[tuple[str, str, int | None, Resharding]]:
    """Every resharding the plan needs: (tensor, consumer op or "output", input index, steps).

    A value resharded to the same target for several consumers is resharded once.
    """
    graph, mesh = plan.graph, plan.mesh
    done: set[tuple[str, Sharding]] = set()
    out = []
    for op in topological_order(graph):
        for i, t in enumerate(op.inputs):
            source, target = plan.produced(t), plan.required(op, i)
            if source != target and (t, target) not in done:
                done.add((t, target))
                tensor = graph.tensors[t]
                out.append((t, op.name, i, plan_resharding(mesh, tensor.shape, tensor.itemsize, source, target, price)))
    for t in graph.outputs:
        source, target = plan.produced(t), plan.final(t)
        if source != target and (t, target) not in done:
            tensor = graph.tensors[t]
            out.append((t, "output", None, plan_resharding(mesh, tensor.shape, tensor.itemsize, source, target, price)))
    return out


def estimate(plan: Plan, hw: Hardware) -> Report:
    graph, mesh = plan.graph, plan.mesh
    report = Report()
    order = topological_order(graph)
    for op in order:
        option = plan.options[op.name]
        cost = op_cost(graph, op, option, mesh, hw)
        report.compute_s += cost.seconds
        report.ops.append({"op": op.name, "kind": op.kind, "option": option.to_json(), "compute_s": cost.seconds,
                           "flops_per_device": cost.flops, "bytes_per_device": cost.bytes, "bound": cost.bound,
                           "communication_s": 0.0, "communication_bytes": 0.0})
    by_name = {entry["op"]: entry for entry in report.ops}
    per_axis_bytes: dict[str, float] = defaultdict(float)
    per_axis_s: dict[str, float] = defaultdict(float)
    for tensor, consumer, index, resharding in plan_reshardings(plan, hw.collective_seconds):
        steps = [s.to_json() for s in resharding.steps]
        moved = sum(_communicated(s) for s in resharding.steps)
        report.reshardings.append({"tensor": tensor, "consumer": consumer, "input": index,
                                   "from": plan.produced(tensor).to_json(),
                                   "to": (plan.final(tensor) if consumer == "output" else plan.required(graph.op_by_name[consumer], index)).to_json(),
                                   "steps": steps, "seconds": resharding.seconds, "bytes_per_device": moved})
        report.communication_s += resharding.seconds
        report.communication_bytes += moved
        for s in resharding.steps:
            for axis in s.mesh_axes:
                # a collective over several axes is charged to each of them
                per_axis_bytes[axis] += _communicated(s)
                per_axis_s[axis] += s.seconds
        if consumer in by_name:
            by_name[consumer]["communication_s"] += resharding.seconds
            by_name[consumer]["communication_bytes"] += moved
    report.bytes_per_axis = dict(per_axis_bytes)
    report.seconds_per_axis = dict(per_axis_s)
    _memory(plan, report, order)
    return report


def _communicated(step) -> float:
    """Bytes a step puts on the wire per device: an all_slice only keeps part of what is local."""
    return 0.0 if step.kind == "all_slice" else step.bytes_per_device


def _memory(plan: Plan, report: Report, order) -> None:
    graph, mesh = plan.graph, plan.mesh
    ranges = live_ranges(graph, order)
    steps = max(len(order), 1)
    usage = [0] * steps
    params = [0] * steps
    for name, tensor in graph.tensors.items():
        size = tensor_bytes(tensor.shape, tensor.itemsize, plan.produced(name), mesh)
        first, last = ranges[name]
        for t in range(first, last + 1):
            usage[t] += size
            if tensor.role == "parameter":
                params[t] += size
    peak = max(range(steps), key=lambda t: usage[t])
    report.peak_memory_bytes = usage[peak]
    report.peak_step = peak
    report.peak_op = order[peak].name if order else ""
    report.parameter_bytes = params[peak]
    report.activation_peak_bytes = usage[peak] - params[peak]
