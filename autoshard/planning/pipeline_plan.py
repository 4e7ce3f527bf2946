"""A training step pipelined over S stages: the layers cut into contiguous parts, each stage a
sub-mesh with the same axes, the step priced by simulating the schedule event by event.

How it is made:
1. One intra-stage plan of the whole graph on the stage's mesh (`make_plan`, with the
   microbatches asked for). Its memory budget is S budgets, as each stage holds about 1/S of
   the graph; each stage's own peak is checked against one budget in step 5. The whole graph's
   peak is not the stages' (a stage also holds the activations of its microbatches in flight),
   so a plan whose stages overflow is solved again on its cut with one memory step per stage
   (`stage_memory`: each stage's state and saved activations as step 5 counts them, within one
   budget), and if that still overflows (or fits nothing) under a whole-graph budget shrunk by
   the worst stage's excess (`FIT_ROUNDS` solves in all): a loose budget lets the solver
   replicate weights that no single stage can hold.
2. Each op's seconds per run from that plan's prices (`estimate`, per op its compute and the
   reshardings into it). The plan is of the step on one microbatch (the microbatch machinery
   divides every batch dim by M), so an op's seconds divided by its runs are its seconds on one
   microbatch as planned, not the whole batch's divided by M: small ops and collectives do not
   shrink linearly with the batch.
3. The cut: S x V parts (V chunks per stage, interleaved) of contiguous layers, chosen by a
   dynamic programme over cut points on the per-layer sums of F + B + W seconds of that one
   plan's ops (`pipeline_stages.balanced_cuts`): no range is planned again. Part `v` runs on
   stage `v mod S` as its chunk `v div S` (the looped placement of `autoshard.pipeline`).
4. Per part F, B and W seconds (ops classified by data flow, `pipeline_work`), per boundary the
   activations (forward) and their gradients (backward) crossing it, each a `send_recv` over
   the stage axis (`STAGE_AXIS`, outermost on the machine, so across nodes when there are
   several), per stage a tail of gradient reduction (the reshardings into the optimizer) and
   the optimizer, once per step.
5. `simulate_pipeline` gives the step and the bubble, and again with the communication that runs
   behind compute hidden (`overlapped_seconds`), the overlapped step; each stage's memory is its parameters,
   gradients and optimizer state as planned plus the activations of the microbatches it holds in
   flight (`activation_peaks`), against the budget.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from autoshard.errors import InfeasibleError, InputError, Problem
from autoshard.graph.model import Graph
from autoshard.graph.summary import size
from autoshard.mesh import Mesh
from autoshard.phases import PhaseTimes
from autoshard.pipeline import PipelineTimeline, StageOrders, activation_peaks, simulate_pipeline, stage_orders
from autoshard.planning.costs import Hardware
from autoshard.planning.formulation import Formulation, resharding_prices
from autoshard.planning.make_plan import (MAX_MEMORY_BUDGET_BYTES, BestSoFar, PlanResult, SolveSettings,
                                          make_plan)
from autoshard.planning.pipeline_cut import PipelineCut
from autoshard.planning.pipeline_stages import balanced_cuts, layer_order, op_positions, position_seconds
from autoshard.pipeline.seconds import DIRECTIONS
from autoshard.planning.pipeline_values import PartValues, StoredBytes
from autoshard.planning.stage_memory import staged_formulation
from autoshard.planning.pipeline_work import seconds_per_run, work_kinds
from autoshard.planning.microbatches import Microbatching
from autoshard.planning.plan import Plan
from autoshard.planning.report import PlanShardings, Report
from autoshard.sharding import Sharding

STAGE_AXIS = "pp"  # the machine mesh's outermost axis, one position per stage
TRANSFER = "send_recv"
TAIL_PARTS = ("gradient reduction", "optimizer")
FIT_ROUNDS = 3  # solves of the stage plan at most: the first, then under shrunk whole-graph budgets
FIT_MARGIN = 0.97  # a shrunk budget aims this far under the stage budget: peaks do not scale exactly
# Where the checks name the settings: `stages` is the pipeline's stage count, `chunks` its schedule's V
SETTING_OF = {"stages": "pipeline", "chunks": "schedule"}


@dataclass(frozen=True)
class PipelineSettings:
    stages: int
    schedule: str = "1f1b"
    chunks: int = 1  # virtual stages per stage (interleaved)


@dataclass(frozen=True)
class Part:
    """One virtual stage: its layers (first, last), its ops in order, and one microbatch's
    seconds and saved activation bytes through it."""

    stage: int
    chunk: int
    layers: tuple[int, int]
    ops: tuple[str, ...]
    forward_s: float
    backward_s: float
    weight_s: float
    saved_bytes: int


@dataclass(frozen=True)
class StageMemory:
    """Per device, what a stage holds at its peak: its state for the whole step and the saved
    activations of the microbatches in flight (the transient values inside one F, B or W are
    left out)."""

    stored: StoredBytes
    activation_bytes: int  # of the microbatches in flight at the stage's peak
    inflight: int  # (microbatch, chunk) pairs held at once

    @property
    def peak_bytes(self) -> int:
        return (self.stored.parameter_bytes + self.stored.gradient_bytes + self.stored.optimizer_state_bytes
                + self.activation_bytes)


@dataclass(frozen=True)
class PipelinedPlan:
    result: PlanResult  # the intra-stage plan of the whole graph: `ops` and `tensors` are the union over stages
    stage_mesh: Mesh
    orders: StageOrders
    parts: tuple[Part, ...]  # in forward order (virtual stages)
    transfer_s: dict[str, list[float]]  # per direction, per boundary between parts
    tail_s: dict[str, list[float]]  # per `TAIL_PARTS` name, per stage
    memory: tuple[StageMemory, ...]
    budget_bytes: float
    timeline: PipelineTimeline
    # the same schedule with the communication that runs behind compute hidden (`overlapped_seconds`)
    overlapped: PipelineTimeline
    tail_hidden_s: list[float]  # per stage, the gradient reduction run behind its last backward

    @property
    def cut(self) -> PipelineCut:
        return PipelineCut(self.orders, {op: virtual for virtual, part in enumerate(self.parts) for op in part.ops})

    def to_json(self) -> dict[str, Any]:
        orders, devices = self.orders, self.stage_mesh.num_devices
        stages = []
        for stage in range(orders.stages):
            memory = self.memory[stage]
            chunks = [part for part in self.parts if part.stage == stage]
            stages.append({
                "stage": stage, "devices": list(range(stage * devices, (stage + 1) * devices)),
                "mesh": {"axes": [{"name": n, "size": s} for n, s in zip(self.stage_mesh.axis_names,
                                                                         self.stage_mesh.shape)]},
                "chunks": [{"virtual_stage": orders.virtual_stage(stage, part.chunk), "layers": list(part.layers),
                            "ops": list(part.ops), "forward_s": part.forward_s, "backward_s": part.backward_s,
                            "weight_s": part.weight_s, "saved_activation_bytes_per_microbatch": part.saved_bytes}
                           for part in chunks],
                "forward_s": sum(p.forward_s for p in chunks), "backward_s": sum(p.backward_s for p in chunks),
                "weight_s": sum(p.weight_s for p in chunks),
                "tail_s": {name: seconds[stage] for name, seconds in self.tail_s.items()},
                "tail_hidden_s": self.tail_hidden_s[stage],
                "busy_s": self.timeline.busy_s[stage], "idle_s": self.timeline.idle_s[stage],
                "memory": {"parameter_bytes": memory.stored.parameter_bytes,
                           "gradient_bytes": memory.stored.gradient_bytes,
                           "optimizer_state_bytes": memory.stored.optimizer_state_bytes,
                           "activation_bytes": memory.activation_bytes, "inflight_chunks": memory.inflight,
                           "peak_bytes": memory.peak_bytes}})
        return {"stages": stages, "stage_count": orders.stages, "stage_axis": STAGE_AXIS,
                "microbatches": orders.microbatches, "virtual_stages_per_stage": orders.chunks,
                "schedule": orders.schedule, "transfer": TRANSFER, "transfer_s": self.transfer_s,
                "memory_budget_bytes_per_device": self.budget_bytes,
                "bubble_fraction": self.timeline.bubble_fraction, "step_s": self.timeline.step_s,
                "overlapped_step_s": self.overlapped.step_s}


def pipeline_mesh(stage_mesh: Mesh, stages: int) -> Mesh:
    """The machine's mesh: the stage axis outermost, then the axes inside a stage."""
    if STAGE_AXIS in stage_mesh.axis_names:
        raise InputError(f"axis {STAGE_AXIS!r} is the pipeline's stage axis; name the axes inside a stage otherwise",
                         "mesh")
    return Mesh((STAGE_AXIS,) + stage_mesh.axis_names, (stages,) + stage_mesh.shape)


def checked_orders(graph: Graph, pipeline: PipelineSettings, microbatches: int) -> StageOrders:
    """The schedule's orders, once the graph is known to have enough layers for its parts; every
    problem named by its setting (`pipeline` for the stages, `schedule` for V, `microbatches`)."""
    stages = pipeline.stages
    if isinstance(stages, bool) or not isinstance(stages, int) or stages < 1:
        raise InputError(f"must be a whole number of stages of at least 1, got {stages!r}", "pipeline")
    try:
        orders = stage_orders(pipeline.schedule, stages, microbatches, pipeline.chunks)
    except InputError as error:
        raise InputError([Problem(SETTING_OF.get(p.where, p.where), p.message) for p in error.problems]) from None
    layers = len(layer_order(graph))
    if orders.virtual_stages > layers:
        parts = f"{stages} stages x {pipeline.chunks} virtual stages" if pipeline.chunks > 1 else f"{stages} stages"
        raise InputError(f"{parts} need at least {orders.virtual_stages} layers, one per part; graph {graph.name!r} "
                         f"has {layers}", "pipeline")
    return orders


def plan_pipeline(graph: Graph, stage_mesh: Mesh, hw: Hardware, settings: SolveSettings, pipeline: PipelineSettings,
                  progress: Callable[[str, float, float, float], None] | None = None,
                  phases: PhaseTimes | None = None, best_so_far: BestSoFar | None = None) -> PipelinedPlan:
    """The pipelined plan of `graph`: `hw` is bound to `pipeline_mesh(stage_mesh, stages)`."""
    orders = checked_orders(graph, pipeline, settings.microbatches)
    phases = PhaseTimes() if phases is None else phases
    result = stage_plan(graph, stage_mesh, hw, settings, orders, progress=progress, phases=phases,
                        best_so_far=best_so_far)
    with phases.phase("pipeline"):
        return price_pipeline(result, stage_mesh, hw, orders, stage_budget_bytes(settings, hw))


def stage_budget_bytes(settings: SolveSettings, hw: Hardware) -> float:
    return settings.memory_budget_bytes if settings.memory_budget_bytes is not None else hw.hbm_bytes


def stage_plan(graph: Graph, stage_mesh: Mesh, hw: Hardware, settings: SolveSettings, fit: StageOrders,
               progress: Callable[[str, float, float, float], None] | None = None,
               phases: PhaseTimes | None = None, best_so_far: BestSoFar | None = None,
               solved: list[PlanResult] | None = None, part_at: Sequence[int] | None = None) -> PlanResult:
    """Step 1: the intra-stage plan of the whole graph, within `stages` budgets per device; while
    a stage of the schedule `fit` is over one budget, solved again with each stage's memory on
    its own on the last plan's cut (`stage_memory`), then under a whole-graph budget shrunk by
    the worst stage's excess (at most `FIT_ROUNDS` solves in all). The plan does not depend on
    the schedule otherwise, so one plan prices every schedule and V (the search's use, fitted to
    its least-memory schedule). A plan solved on a cut carries it (`PlanResult.cut`), and
    `price_pipeline` cuts it there. When no solve fits, the one closest to fitting is returned
    and the caller's pricing names its stages over. `solved` collects every round's plan, the
    first one's shardings not yet bent to fit a stage; `part_at` fixes the cut."""
    budget = stage_budget_bytes(settings, hw)
    whole = min(budget * fit.stages, MAX_MEMORY_BUDGET_BYTES)
    found: list[tuple[float, PlanResult]] = []  # (worst stage's peak, plan) of each solve
    prices = resharding_prices(stage_mesh, hw)  # found by the first solve's formulation, reused by the next
    staged_cut: list[int] | None = None  # set once the last plan overflowed: solve next on its cut per stage
    for _ in range(FIT_ROUNDS):
        memory = None if staged_cut is None else _staged(staged_cut, fit, budget)
        try:
            result = make_plan(graph, stage_mesh, hw, replace(settings, memory_budget_bytes=whole if memory is None
                                                              else budget),
                               progress=progress, phases=phases, best_so_far=best_so_far, prices=prices, memory=memory)
        except InfeasibleError as error:
            if found and memory is not None:  # no plan fits the stages on this cut: shrink instead
                staged_cut = None
                continue
            if found:  # nothing fits the shrunk budget
                break
            raise InfeasibleError(f"the whole graph on one stage's mesh, within {fit.stages} x the budget per device "
                                  f"(each stage holds about 1/{fit.stages} of it): {error}") from None
        if part_at is not None or staged_cut is not None:
            result = replace(result, cut=tuple(part_at if part_at is not None else staged_cut))
        if solved is not None:
            solved.append(result)
        priced = price_pipeline(result, stage_mesh, hw, fit, math.inf)
        worst = max(m.peak_bytes for m in priced.memory)
        if worst <= budget:
            return result
        found.append((worst, result))
        if memory is None and len(found) == 1:
            staged_cut = list(part_at) if part_at is not None else positions_cut(priced)
            continue
        staged_cut = None
        # the stages' peaks follow the whole graph's loosely (a stage holds its microbatches in
        # flight, the whole graph one microbatch of every layer): each round shrinks from the last
        # plan's peak, so a round that moved the stages too little is followed by a harder one
        whole = result.report.peak_memory_bytes * budget / worst * FIT_MARGIN
    return min(found, key=lambda entry: entry[0])[1]


def positions_cut(pipelined: PipelinedPlan) -> list[int]:
    """The virtual stage of each layer position in a priced plan's cut."""
    layers = layer_order(pipelined.result.plan.graph)
    index = {layer: i for i, layer in enumerate(layers)}
    cut = [0] * len(layers)
    for part, found in enumerate(pipelined.parts):
        for position in range(index[found.layers[0]], index[found.layers[1]] + 1):
            cut[position] = part
    return cut


def _staged(cut: Sequence[int], orders: StageOrders, budget: float) -> Callable[[Formulation], Formulation]:
    """The stage-per-step memory (`stage_memory`) of a formulation, on `cut` (per layer position)."""
    def staged(formulation: Formulation) -> Formulation:
        graph = formulation.graph
        positions = op_positions(graph)
        kinds = work_kinds(graph, positions)
        return staged_formulation(formulation, {name: cut[p] for name, p in positions.items()}, kinds, orders,
                                  budget)
    return staged


def price_pipeline(result: PlanResult, stage_mesh: Mesh, hw: Hardware, orders: StageOrders,
                   budget: float, work: StageWork | None = None, part_at: Sequence[int] | None = None
                   ) -> PipelinedPlan:
    """Steps 2 to 5 on an intra-stage plan: the cut, the seconds, the simulation and the memory.
    `work`: `StageWork.of(result)`, when one plan is priced under many schedules; `part_at`:
    the virtual stage of each layer position, when the cut is given rather than balanced (by
    default the plan's own, `PlanResult.cut`, when it has as many parts)."""
    graph = result.plan.graph
    work = StageWork.of(result) if work is None else work
    if part_at is None and result.cut is not None and max(result.cut) + 1 == orders.virtual_stages:
        part_at = result.cut  # the cut the plan was fitted to
    if part_at is None:
        per_position = position_seconds(work.positions, {name: s for name, s in work.seconds.items()
                                                          if work.kinds[name] != "tail"}, len(layer_order(graph)))
        cuts = balanced_cuts(per_position, orders.virtual_stages)
        part_at = [part for part, (start, end) in enumerate(cuts) for _ in range(start, end)]
    part_of = {name: part_at[position] for name, position in work.positions.items()}
    return price_cut(result, stage_mesh, hw, orders, part_of, budget, work)


@dataclass(frozen=True)
class StageWork:
    """What pricing a plan's pipeline needs whatever the cut: each op's place in layer order, its
    kind (F, B, W or tail) and its seconds per run, and each value's sharding as produced."""

    positions: dict[str, int]
    kinds: dict[str, str]
    per_run: dict[str, dict[str, float]]
    produced: Mapping[str, Sharding]

    @property
    def seconds(self) -> dict[str, float]:
        return {name: entry["compute"] + entry["communication"] for name, entry in self.per_run.items()}

    @classmethod
    def of(cls, result: PlanResult) -> "StageWork":
        graph = result.plan.graph
        positions = op_positions(graph)
        return cls(positions, work_kinds(graph, positions), seconds_per_run(result.report, graph),
                   PlanShardings.of(result.plan).produced)


def price_cut(result: PlanResult, stage_mesh: Mesh, hw: Hardware, orders: StageOrders, part_of: Mapping[str, int],
              budget: float, work: StageWork | None = None, refuse_over_budget: bool = True) -> PipelinedPlan:
    """Steps 4 and 5 on a given cut (op -> virtual stage): a plan just cut, or one read back from
    plan.json (`estimate`, which reports a stage over the budget instead of refusing it)."""
    graph = result.plan.graph
    work = StageWork.of(result) if work is None else work
    kinds, seconds, layers = work.kinds, work.seconds, layer_order(graph)
    count = orders.virtual_stages
    values = PartValues(result.plan, part_of, kinds, work.produced)
    saved = values.saved_bytes(count)
    ops: list[list[str]] = [[] for _ in range(count)]
    for op in graph.order:
        ops[part_of[op.name]].append(op.name)
    spans = [(min(work.positions[name] for name in names), max(work.positions[name] for name in names))
             if names else (0, 0) for names in ops]
    parts = tuple(Part(*orders.placement(part), (layers[first], layers[last]), tuple(ops[part]),
                       *(sum((seconds[name] for name in ops[part] if kinds[name] == kind), 0.0)
                         for kind in ("F", "B", "W")), saved[part]) for part, (first, last) in enumerate(spans))
    transfer_s = {direction: [sum(hw.collective_seconds(TRANSFER, [STAGE_AXIS], values.bytes_of(t)) for t in crossing)
                              for crossing in boundaries]
                  for direction, boundaries in values.crossing(count).items()}
    tail_s = _tail_seconds(work.per_run, kinds, {name: orders.placement(part)[0] for name, part in part_of.items()},
                           orders.stages)
    transfers = [transfer_s[d] for d in DIRECTIONS] if count > 1 else None
    timeline = simulate_pipeline(orders, *_per_chunk(parts, orders), transfer_s=transfers, tail_s=tail_s)
    overlapped_parts, overlapped_tail, tail_hidden_s = overlapped_seconds(work, kinds, part_of, parts, orders, tail_s)
    overlapped = simulate_pipeline(orders, *_per_chunk(overlapped_parts, orders), transfer_s=transfers,
                                   tail_s=overlapped_tail)
    accumulated = result.microbatching.accumulated if result.microbatching is not None else {}
    stored = values.stored_bytes({index: part.stage for index, part in enumerate(parts)},
                                 orders.stages, accumulated)
    held = activation_peaks(orders, [[parts[orders.virtual_stage(s, c)].saved_bytes for c in range(orders.chunks)]
                                     for s in range(orders.stages)])
    memory = tuple(StageMemory(stored[s], int(held[s]), timeline.inflight_peak[s]) for s in range(orders.stages))
    if refuse_over_budget:
        check_budget(memory, budget)
    return PipelinedPlan(result, stage_mesh, orders, parts, transfer_s, tail_s, memory, budget, timeline, overlapped,
                         tail_hidden_s)


def overlapped_seconds(work: StageWork, kinds: Mapping[str, str], part_of: Mapping[str, int], parts: tuple[Part, ...],
                       orders: StageOrders, tail_s: dict[str, list[float]]
                       ) -> tuple[tuple[Part, ...], dict[str, list[float]], list[float]]:
    """The parts and tails with the communication that can run behind compute hidden (`overlap`).

    Each part's F, B and W: max(compute, hideable) + exposed over its ops of that kind (a
    parameter's all_gather prefetched behind the part's compute). The tail's gradient reduction
    runs after the stage's last microbatch; conservatively only the backward compute of that
    microbatch's last part on the stage (its chunk 0, which runs last), less what already runs
    behind it, is counted beside it,
    though the reductions of the layers done earlier could also start behind the backward of the
    microbatches before. Transfers need nothing here: the event simulation already sends them
    while the stages compute, so in the steady state they are hidden and at the ramps exposed."""
    sums = np.zeros((len(parts), 3, 3))  # part, kind (F, B, W), (compute, communication, hideable)
    tail_hideable = [0.0] * orders.stages
    for name, entry in work.per_run.items():
        if kinds[name] == "tail":
            tail_hideable[orders.placement(part_of[name])[0]] += entry["hideable"]
        else:
            sums[part_of[name], "FBW".index(kinds[name])] += (entry["compute"], entry["communication"],
                                                              entry["hideable"])
    compute, communication, hide = sums[..., 0], sums[..., 1], sums[..., 2]
    seconds = np.maximum(compute, hide) + communication - hide
    overlapped = tuple(replace(part, forward_s=float(seconds[i, 0]), backward_s=float(seconds[i, 1]),
                               weight_s=float(seconds[i, 2])) for i, part in enumerate(parts))
    last = {part.stage: i for i, part in enumerate(parts) if part.chunk == 0}
    free = np.maximum(compute - hide, 0.0)  # compute not already running the part's own hideable communication
    hidden = [min(tail_hideable[stage], float(free[last[stage], 1] + free[last[stage], 2]))
              for stage in range(orders.stages)]
    tail = dict(tail_s, **{"gradient reduction": [max(0.0, reduction - h) for reduction, h in
                                                  zip(tail_s["gradient reduction"], hidden)]})
    return overlapped, tail, hidden


def estimate_cut(plan: Plan, report: Report, microbatching: Microbatching | None, stage_mesh: Mesh, hw: Hardware,
                 cut: PipelineCut) -> PipelinedPlan:
    """A plan read back with its cut (plan.json's `pipeline`), priced as `estimate` priced it:
    each stage's memory reported against the chip's HBM, not refused."""
    result = PlanResult(plan, report, {}, PhaseTimes(), microbatching)
    return price_cut(result, stage_mesh, hw, cut.orders, cut.part_of, hw.hbm_bytes, refuse_over_budget=False)


def _tail_seconds(per_run: dict[str, dict[str, float]], kinds: dict[str, str], stage_of: dict[str, int],
                  stages: int) -> dict[str, list[float]]:
    """Per stage, the reshardings into its optimizer ops (the gradients' reduction across data
    replicas, priced where the optimizer reads them) and the optimizer's compute."""
    tail_s = {name: [0.0] * stages for name in TAIL_PARTS}
    for name, entry in per_run.items():
        if kinds[name] == "tail":
            tail_s["gradient reduction"][stage_of[name]] += entry["communication"]
            tail_s["optimizer"][stage_of[name]] += entry["compute"]
    return tail_s


def _per_chunk(parts: tuple[Part, ...], orders: StageOrders) -> np.ndarray:
    """The parts' F, B and W seconds as a (3, stages, chunks) table."""
    table = np.zeros((3, orders.stages, orders.chunks))
    for part in parts:
        table[:, part.stage, part.chunk] = (part.forward_s, part.backward_s, part.weight_s)
    return table


def check_budget(memory: tuple[StageMemory, ...], budget: float) -> None:
    """An error naming every stage whose peak is over the budget, with its parts."""
    over = [f"stage {stage} needs {size(m.peak_bytes)} per device (parameters {size(m.stored.parameter_bytes)}, "
            f"gradients {size(m.stored.gradient_bytes)}, optimizer state {size(m.stored.optimizer_state_bytes)}, "
            f"activations {size(m.activation_bytes)} of {m.inflight} microbatch chunk(s) in flight)"
            for stage, m in enumerate(memory) if m.peak_bytes > budget]
    if over:
        raise InfeasibleError(f"{'; '.join(over)}: over the memory budget of {size(budget)} per device; use more "
                              f"stages, more devices per stage, or a schedule holding fewer microbatches")
