"""`pipeline`: run an exported program's training step as a pipelined plan says, through
torch.distributed.pipelining.

Every rank calls it (one process per rank, e.g. under torchrun). The machine is the plan's:
the stage axis `pp` outermost, then the axes inside a stage, so rank r runs stage
r div (devices per stage). The rank builds the `PipelineStage` of each of its stage's chunks
(virtual stage c·S + s, the looped placement of both the plan and torch's interleaved schedules)
and the plan's schedule over the plan's microbatches:

    ep = torch.export.export(module, (x,)).run_decompositions({})
    run = pipeline(ep, json.load(open("plan.json")))          # plan --pipeline S --microbatches M
    losses = []
    run.schedule.step(x, target=labels, losses=losses)          # arguments on the first stage, labels on the last
    optimizer = torch.optim.Adam([p for m in run.modules for p in m.parameters()])

The step is the one the plan was made for: the loss is `sum(output * labels)`, the loss
`import_program(..., training=True)` adds, unless `loss_fn` is given, and the parameters'
gradients are summed over the microbatches (not averaged: the sum of the microbatches' losses
is the whole batch's). The program's arguments are split into microbatches along dim 0, as
torch.distributed.pipelining does by default (`import_program(..., batch_dim=0)`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from autoshard.errors import InputError
from autoshard.frontends.torch.apply import check_mesh, plan_of_ops, resharding_steps
from autoshard.frontends.torch.importer import ImportedProgram, import_program
from autoshard.frontends.torch.runtime import require_torch
from autoshard.frontends.torch.stage_cut import StagePart, cut_program
from autoshard.frontends.torch.stage_module import PlainStage, ShardedStage
from autoshard.graph.model import Graph
from autoshard.graph.recompute import stated_recompute, with_recomputation
from autoshard.mesh import Mesh
from autoshard.planning.microbatches import microbatch
from autoshard.planning.pipeline_cut import PipelineCut, read_cut
from autoshard.planning.pipeline_plan import pipeline_mesh
from autoshard.planning.plan import stated_mesh
from autoshard.planning.plan_contract import read_plan

torch = require_torch()
import torch.distributed as dist  # noqa: E402  (after the check above)
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,  # noqa: E402
                                          ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble)

# The plan's schedules -> torch's; the orders of each were checked equal to torch's in
# tests/test_pipeline_schedules.py (ZB-H1 is torch's interleaved zero bubble on one chunk)
SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved": ScheduleInterleaved1F1B,
             "zb-h1": ScheduleInterleavedZeroBubble}
ONE_STAGE_PER_RANK = ("gpipe", "1f1b")  # torch's single-stage schedules take one stage, the others a list
BATCH_DIM = 0  # where torch.distributed.pipelining splits the arguments into microbatches by default


@dataclass(frozen=True)
class PipelineRun:
    schedule: Any  # torch's schedule: `step(*args, target=labels, losses=[])` on every rank
    stages: list[Any]  # this rank's `PipelineStage`s, chunk by chunk

    @property
    def modules(self) -> list[Any]:
        """This rank's stage modules, chunk by chunk: their parameters are the ones to step."""
        return [stage.submod for stage in self.stages]


def weighted_sum(output: Any, labels: Any) -> Any:
    """The loss of the training step `import_program(..., training=True)` adds."""
    return (output * labels).sum()


def pipeline(exported_program: Any, plan: Mapping[str, Any], device_mesh: Any = None,
             loss_fn: Callable[[Any, Any], Any] | None = None) -> PipelineRun:
    """This rank's stages of `exported_program` pipelined as `plan` (a plan.json document made by
    `plan --pipeline S` for the program's graph, forward or `--training`) says.

    `device_mesh` has the plan's machine mesh (`pp`, then the stage's axes); by default it is
    made on the CPU over the default process group, whose size must be the plan's devices.
    """
    if not isinstance(plan, Mapping):
        raise InputError(f"expected the document of a plan.json written by `autoshard plan --pipeline S`, got "
                         f"{type(plan).__name__}", "plan")
    if plan.get("pipeline") is None:
        raise InputError("the plan has no `pipeline` section: make one with `autoshard plan --pipeline S`, or run a "
                         "plan of one mesh with autoshard.frontends.torch.parallelize", "plan")
    stage_mesh = stated_mesh(dict(plan))
    if stage_mesh is None:
        raise InputError("expected the plan's stage mesh as mesh.axes", "/mesh")
    forward = import_program(exported_program, batch_dim=BATCH_DIM)  # on the whole batch
    graph = _planned_graph(exported_program, plan, forward)
    cut = read_cut(dict(plan), graph)
    read_plan(dict(plan), graph, stage_mesh)  # every field against the program's graph, as the CLI reads it
    machine = pipeline_mesh(stage_mesh, cut.orders.stages)
    device_mesh = device_mesh if device_mesh is not None else _machine_mesh(machine)
    check_mesh(machine, device_mesh)
    parts = cut_program(forward, cut.part_of, cut.orders.virtual_stages)
    one = microbatch(forward.graph, cut.orders.microbatches).graph  # what each stage runs at a time
    modules = [_stage_module(exported_program, forward, one, plan, stage_mesh, device_mesh, part, cut)
               for part in _my_parts(parts, cut, device_mesh)]
    device = torch.device(device_mesh.device_type)
    group = device_mesh[machine.axis_names[0]].get_group()
    stages = [PipelineStage(module, module.part.virtual_stage, cut.orders.virtual_stages, device, group=group)
              for module in modules]
    schedule_type = SCHEDULES[cut.orders.schedule]
    schedule = schedule_type(stages[0] if cut.orders.schedule in ONE_STAGE_PER_RANK else stages,
                             cut.orders.microbatches, loss_fn=loss_fn or weighted_sum, scale_grads=False)
    return PipelineRun(schedule, stages)


def _planned_graph(exported_program: Any, plan: Mapping[str, Any], forward: ImportedProgram) -> Graph:
    """The graph the plan was made for: the program's forward graph, or its training step when
    the plan has ops the forward graph lacks (as `import torch --training` makes it)."""
    ops = plan.get("ops")
    if isinstance(ops, Mapping) and not set(ops) <= set(forward.graph.op_by_name):
        step = import_program(exported_program, training=True, batch_dim=BATCH_DIM).graph
        return with_recomputation(step, stated_recompute(plan))  # as `plan --recompute` rewrote it
    return forward.graph


def _machine_mesh(machine: Mesh) -> Any:
    if not dist.is_initialized():
        raise InputError("torch.distributed is not initialised: run one process per rank (torchrun --nproc-per-node "
                         f"{machine.num_devices}), each calling torch.distributed.init_process_group", "device_mesh")
    if dist.get_world_size() != machine.num_devices:
        raise InputError(f"the plan runs on {machine.num_devices} devices ({machine}) but the process group has "
                         f"{dist.get_world_size()} ranks", "device_mesh")
    return init_device_mesh("cpu", machine.shape, mesh_dim_names=machine.axis_names)


def _my_parts(parts: list[StagePart], cut: PipelineCut, device_mesh: Any) -> list[StagePart]:
    """The parts this rank's stage runs, chunk by chunk."""
    stage = device_mesh.get_coordinate()[0]
    return [parts[cut.orders.virtual_stage(stage, chunk)] for chunk in range(cut.orders.chunks)]


def _stage_module(exported_program: Any, forward: ImportedProgram, one: Graph, plan: Mapping[str, Any],
                  stage_mesh: Mesh, device_mesh: Any, part: StagePart, cut: PipelineCut) -> Any:
    """The module of one part, on the program's forward graph of one microbatch (`one`)."""
    first, last = part.virtual_stage == 0, part.virtual_stage == cut.orders.virtual_stages - 1
    if all(size == 1 for size in stage_mesh.shape):
        return PlainStage(exported_program, forward, one, part)
    stage_plan = plan_of_ops(plan, one, stage_mesh)
    return ShardedStage(exported_program, forward, stage_plan, device_mesh[stage_mesh.axis_names],
                        resharding_steps(plan, stage_plan), part, first, last)
