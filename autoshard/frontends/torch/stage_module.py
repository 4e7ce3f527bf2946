"""A virtual stage's part of a program as the module a `PipelineStage` wraps: it takes the values
crossing into the stage, runs the stage's steps on one microbatch, and returns the values crossing
out (the program's outputs, whole, from the last stage).

On a stage mesh with an axis of size > 1 (`ShardedStage`) the stage runs as `parallelize` runs a
program: its parameters are DTensors stored as planned and each op reads its inputs in the
sharding its option says. A value crosses to the next stage as its shard on each device, in the
sharding it was produced in (a partial sum reduced first), so the two ranks at the same place
of neighbouring stages exchange blocks of the same layout. Otherwise (`PlainStage`) the steps
run on plain tensors.

Both run on one microbatch: a reshape or a broadcast goes to its shape in the plan's graph of
one microbatch, not to the whole batch's shape the program was exported with.
"""

from __future__ import annotations

from typing import Any

from autoshard.frontends.torch.apply import TORCH_DTYPES, ShardedProgram, attach, call_at_shape, stored_value
from autoshard.frontends.torch.importer import ImportedProgram
from autoshard.frontends.torch.runtime import require_torch
from autoshard.frontends.torch.stage_cut import StagePart
from autoshard.graph.model import Graph
from autoshard.planning.plan import Plan
from autoshard.sharding import Sharding

torch = require_torch()
from torch.distributed.tensor import DTensor, Partial, Replicate  # noqa: E402  (after the check above)


class ShardedStage(ShardedProgram):
    """A part on its stage's sub-mesh, its parameters DTensors placed by the plan."""

    def __init__(self, exported_program: Any, imported: ImportedProgram, plan: Plan, device_mesh: Any,
                 resharding_steps: dict[tuple[str, Sharding], list[Sharding]], part: StagePart, first: bool,
                 last: bool):
        super().__init__(exported_program, imported, plan, device_mesh, resharding_steps, held=part.held)
        self.part, self.first, self.last = part, first, last

    def forward(self, *tensors: Any) -> Any:
        values = self._held_values()
        whole = dict(self._whole_buffers)
        for name, tensor in zip(self.part.inputs, tensors):
            if self.first:  # the program's arguments: the microbatch, whole on every rank
                whole[name] = tensor
                value = DTensor.from_local(tensor, self.device_mesh, self._replicated(), run_check=False)
                values[name] = value.redistribute(self.device_mesh, self._placements[name])
            else:
                values[name] = DTensor.from_local(tensor, self.device_mesh, self._crossing(name), run_check=False,
                                                  **self._global(name))
        placed = self._run(list(self.part.steps), values, whole)
        if self.last:
            return _returned([placed(name, self._replicated()).to_local() for name in self.part.outputs])
        return _returned([placed(name, self._crossing(name)).to_local() for name in self.part.outputs])

    def _replicated(self) -> tuple[Any, ...]:
        return (Replicate(),) * self.device_mesh.ndim

    def _crossing(self, name: str) -> tuple[Any, ...]:
        """The placements a value crosses between stages in: as produced, a partial sum reduced."""
        return tuple(Replicate() if isinstance(p, Partial) else p for p in self._placements[name])

    def _global(self, name: str) -> dict[str, Any]:
        """The whole value's shape and strides, which a block does not tell when shards are uneven."""
        shape = torch.Size(self.plan.graph.tensors[name].shape)
        return {"shape": shape, "stride": torch.empty(shape, device="meta").stride()}


class PlainStage(torch.nn.Module):
    """A part on one device per stage, on plain tensors."""

    def __init__(self, exported_program: Any, imported: ImportedProgram, graph: Graph, part: StagePart):
        super().__init__()
        self.graph, self.part = graph, part
        self._stored: dict[str, str] = {}  # graph name -> qualified name of the parameter or buffer
        for name in sorted(part.held):
            target = imported.parameters[name]
            value = stored_value(exported_program, target)
            parameter = graph.tensors[name].role == "parameter"  # copied: stepping it leaves the program as exported
            attach(self, target, torch.nn.Parameter(value.detach().clone(), requires_grad=value.requires_grad)
                   if parameter else value.detach(), parameter)
            self._stored[name] = target
        self._scalars = {name: torch.tensor(number, dtype=TORCH_DTYPES[dtype])
                         for name, (number, dtype) in imported.scalars.items()}

    def forward(self, *tensors: Any) -> Any:
        values = dict(zip(self.part.inputs, tensors)) | self._scalars
        values |= {name: self.get_parameter(target) if self.graph.tensors[name].role == "parameter"
                   else self.get_buffer(target) for name, target in self._stored.items()}
        producers = self.graph.producers
        for step in self.part.steps:
            inputs = [values[t] for t in step.inputs]
            if step.opaque:
                result = step.call(*inputs)
                results = result if isinstance(result, (tuple, list)) else [result]
                values.update((name, value) for name, value in zip(step.outputs, results) if name)
            else:
                (name,) = step.outputs
                values[name] = call_at_shape(step, producers[name].kind, inputs, self.graph.tensors[name].shape)
        return _returned([values[name] for name in self.part.outputs])


def _returned(values: list[Any]) -> Any:
    """One value bare, as a program with one output returns it (the loss function takes it so)."""
    return values[0] if len(values) == 1 else tuple(values)
