"""The task `search --pipeline auto` fans out: one intra-stage plan for a stage count, a sub-mesh
and a microbatch count, run by the search's workers (local processes or Ray) like its other tasks.
Pricing the schedules on it is cheap and runs where the search runs."""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autoshard.errors import InfeasibleError, InputError, OutOfTime
from autoshard.graph.schema import load_graph
from autoshard.planning.hardware import bind_hardware
from autoshard.planning.pipeline_plan import STAGE_AXIS, PipelineSettings, checked_orders, pipeline_mesh, stage_plan
from autoshard.search.candidates import Candidate, machines_for

# The plan is fitted to the stages' memory under 1F1B, which holds the fewest microbatches of the
# schedules the search prices; a schedule holding more may still be over (priced "over budget").
LEAST_MEMORY_SCHEDULE = "1f1b"

if TYPE_CHECKING:  # tasks.py dispatches to this module
    from autoshard.search.tasks import SearchInputs


@dataclass(frozen=True)
class StageTask:
    stages: int
    candidate: Candidate  # one stage's sub-mesh and its placement inside the stage
    microbatches: int

    @property
    def devices(self) -> int:
        return self.stages * math.prod(self.candidate.axis_sizes)


@dataclass(frozen=True)
class StagePlacement:
    """The machine bound as `pp=S` then the sub-mesh, and where (as `deliver` records it)."""

    hardware: Any
    nodes: int
    slice_shape: tuple[int, ...] | None
    mapping: dict[str, list[str]]


def bind_stages(topology: str, devices: int, stages: int, candidate: Candidate) -> StagePlacement | None:
    """The machine of `devices` bound as `pp=S` then the sub-mesh, the sub-mesh's axes on the
    physical dims its placement names and `pp` on the first set of dims that binds (the outer
    dims first: across nodes when the stages fill whole nodes). None when no set binds."""
    mesh = pipeline_mesh(candidate.mesh, stages)
    for machine in machines_for(topology, devices):
        dims = [d.name for d in machine.dims]
        for chosen in (s for c in range(1, len(dims) + 1) for s in itertools.combinations(dims, c)):
            mapping = {STAGE_AXIS: list(chosen), **candidate.mapping_json}
            slice_shape = tuple(machine.slice_shape) if machine.slice_shape else None
            try:
                hardware = bind_hardware(topology, mesh, nodes=machine.nodes, slice_shape=slice_shape, mapping=mapping)
            except InputError:
                continue
            return StagePlacement(hardware, machine.nodes, slice_shape, mapping)
    return None


def solve_stage_task(inputs: SearchInputs, task: StageTask, time_limit_s: float) -> dict[str, Any]:
    """`{"result": PlanResult}`, or why there is none: `"infeasible"` or `"unsolved"` (out of time)."""
    placement = bind_stages(inputs.topology, task.devices, task.stages, task.candidate)
    if placement is None:
        return {"infeasible": f"{STAGE_AXIS}={task.stages} and this sub-mesh do not bind to the machine together"}
    try:
        graph = load_graph(inputs.graph_document, task.candidate.mesh)
    except InputError as error:  # a constraint of the graph names an axis this sub-mesh lacks
        return {"infeasible": f"the graph's constraints do not fit this sub-mesh: {error}"}
    settings = dataclasses.replace(inputs.settings, microbatches=task.microbatches, time_limit_s=time_limit_s)
    try:
        fit = checked_orders(graph, PipelineSettings(task.stages, LEAST_MEMORY_SCHEDULE), task.microbatches)
        return {"result": stage_plan(graph, task.candidate.mesh, placement.hardware, settings, fit)}
    except InfeasibleError as error:
        return {"infeasible": str(error)}
    except OutOfTime as error:
        return {"unsolved": str(error)}
