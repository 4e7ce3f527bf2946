"""The values a cut training step moves and holds per part (virtual stage) and per stage: what
crosses each boundary, what each microbatch leaves saved for its backward, and the state each
stage stores.

Parts are numbered in forward order; boundary `b` joins parts `b` and `b + 1`. Sizes are per
device, each value at its sharding as produced (or stored) in the plan.
- A value crosses boundaries forward when it is made by a forward op and read by a forward or
  backward op on a later part (once per boundary it passes: a skip connection is relayed), and
  backward when an op before the optimizer on a later part makes it and one on an earlier part
  reads it (the gradients of the boundary activations). Graph inputs are fed to every part and
  parameters stay where they are stored: neither crosses.
- A microbatch through a part saves the values its backward reads that the forward made (on this
  part or an earlier one) or the batch brought (labels), from its `F` until its `W`.
- A stage stores the parameters and optimizer state its ops read (a tied weight on every stage
  that reads it) and the gradients its ops make, each held as its accumulator across
  microbatches (`Microbatching.accumulated`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from autoshard.pipeline.seconds import DIRECTIONS
from autoshard.planning.costs import tensor_bytes
from autoshard.planning.plan import Plan
from autoshard.planning.report import PlanShardings
from autoshard.planning.roles import tensor_roles
from autoshard.sharding import Sharding


@dataclass(frozen=True, slots=True)
class StoredBytes:
    """Per device, the bytes a stage stores for the whole step."""

    parameter_bytes: int
    gradient_bytes: int
    optimizer_state_bytes: int


class PartValues:
    """The values of `plan` on its parts: `part_of` gives each op's part; `kinds` (`work_kinds`)
    tells the optimizer (`tail`) and the forward (`F`) from the backward."""

    def __init__(self, plan: Plan, part_of: Mapping[str, int], kinds: Mapping[str, str],
                 produced: Mapping[str, Sharding] | None = None):
        self.plan, self.part_of, self.kinds = plan, part_of, kinds
        # each value's sharding as produced; derived here unless the caller has it (one plan, many cuts)
        self.produced = PlanShardings.of(plan).produced if produced is None else produced

    def bytes_of(self, tensor: str) -> int:
        t = self.plan.graph.tensors[tensor]
        return tensor_bytes(t.shape, t.itemsize, self.produced[tensor], self.plan.mesh)

    def crossing(self, parts: int) -> dict[str, list[list[str]]]:
        """Per direction, per boundary, the values crossing it in one microbatch's pass."""
        graph = self.plan.graph
        out = {direction: [[] for _ in range(parts - 1)] for direction in DIRECTIONS}
        for t, maker in graph.producers.items():
            kind = self.kinds[maker.name]
            readers = [self.part_of[r.name] for r in graph.consumers[t] if self.kinds[r.name] != "tail"]
            if kind == "tail" or not readers:
                continue
            made = self.part_of[maker.name]
            if kind == "F":
                for boundary in range(made, max(readers)):
                    out["forward"][boundary].append(t)
            for boundary in range(min(readers), made):
                out["backward"][boundary].append(t)
        return out

    def saved_bytes(self, parts: int) -> list[int]:
        """Per part, the bytes one microbatch leaves saved for its backward."""
        graph = self.plan.graph
        saved: list[set[str]] = [set() for _ in range(parts)]
        for op in graph.ops:
            if self.kinds[op.name] not in ("B", "W"):
                continue
            for t in op.inputs:
                maker = graph.producers.get(t)
                made_forward = maker is not None and self.kinds[maker.name] == "F"
                batch_input = maker is None and graph.tensors[t].batch_dim is not None
                if made_forward or batch_input:
                    saved[self.part_of[op.name]].add(t)
        return [sum(self.bytes_of(t) for t in values) for values in saved]

    def stored_bytes(self, stage_of_part: Mapping[int, int], stages: int,
                     accumulated: Mapping[str, int]) -> list[StoredBytes]:
        """Per stage, its parameters, gradients (as accumulators) and optimizer state."""
        graph = self.plan.graph
        roles = tensor_roles(graph)
        held = {role: [0] * stages for role in ("parameter", "gradient", "optimizer_state")}
        for name, tensor in graph.tensors.items():
            role = roles[name]
            if name not in graph.producers and role in ("parameter", "optimizer_state"):
                for stage in sorted({stage_of_part[self.part_of[r.name]] for r in graph.consumers[name]}):
                    held[role][stage] += self.bytes_of(name)
            elif tensor.grad_of is not None and name in graph.producers:
                stage = stage_of_part[self.part_of[graph.producers[name].name]]
                held["gradient"][stage] += self.bytes_of(name) * accumulated.get(name, 1)
        return [StoredBytes(held["parameter"][s], held["gradient"][s], held["optimizer_state"][s])
                for s in range(stages)]
