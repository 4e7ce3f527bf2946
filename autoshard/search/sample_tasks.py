"""The task `search --by-layer` fans out: the layer sample planned on one stage's sub-mesh for one
stage count, microbatch count and recomputation, read as per-layer prices (`layer_prices`) with
a certified bound per sample position. Run by the search's workers like its other tasks.

Where the graph has the value names of `generate gpt --style megatron` or `--style llama`, the
sample is first planned with the layout published runs use pinned on the task's sub-mesh
(`_published_start`); the free solves start from that plan, and it stays one of the task's
plans. Each task is then solved for speed alone (no memory limit: the stages' memory is checked
when each schedule is priced). When that plan's fewest-microbatches pipeline
(1F1B, V = 1) holds more than a stage's budget, the same formulation is solved again under a
whole-sample budget shrunk by the worst stage's excess, as `stage_plan` refits a whole graph
(`FIT_MARGIN`; at most two refits, fewer than `stage_plan`'s rounds: the search has other keys,
other recomputations and microbatch counts, to fit with; a refit that misses by a little is
common, as peaks do not scale with the budget exactly); every plan found is priced, so a
schedule can take whichever fits. A plan solved under a memory limit is no faster than the
fastest plan, so there is no refit when the fastest plan's step, less its solver gap, over S
(the busiest stage's share of the serial seconds), cannot beat the best step the search had
found when the task was sent (`beat_s`).

The bound. Charging every edge of the formulation to its reader, each node of the problem
contributes its cheapest strategy with its in-edges' cheapest costs (`consumer_bound_ps`), and
the sum over nodes is at most any plan's objective. A middle layer's nodes in the whole graph
have the strategies, costs and in-edges of the sample's middle layer (the neighbours are of the
same kinds, `layer_sample`), so summing each sample position's nodes times the layers it stands
for bounds the whole graph's objective on this sub-mesh and microbatch count, with no memory
limit and so for every plan. Its serial seconds over S bound the step of every schedule.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from autoshard.errors import InfeasibleError, InputError, OutOfTime
from autoshard.graph.recompute import with_recomputation
from autoshard.graph.schema import load_graph
from autoshard.pipeline.step import step_orders
from autoshard.planning.formulation import (PICOSECONDS, TIE_BREAK_PS_PER_BYTE, Formulation, ReshardingPrices,
                                            resharding_prices)
from autoshard.planning.layer_prices import LayerPrices, layer_prices, price_layers
from autoshard.models.layouts import layer_style, megatron_constraints
from autoshard.models.llama_layout import llama_constraints, routed_experts
from autoshard.planning.costs import Hardware
from autoshard.planning.make_plan import MAX_MEMORY_BUDGET_BYTES, PlanResult, SolveSettings, make_plan
from autoshard.planning.pipeline_plan import FIT_MARGIN
from autoshard.planning.pipeline_stages import op_positions
from autoshard.planning.roles import plan_roles
from autoshard.search.candidates import Candidate, slow_axes
from autoshard.search.stage_tasks import STAGE_AXIS, bind_stages

SOLVES = 3  # the fastest plan, and up to two refitted to the stages' memory

if TYPE_CHECKING:  # tasks.py dispatches to this module
    from autoshard.search.tasks import SearchInputs


@dataclass(frozen=True)
class SampleTask:
    stages: int
    candidate: Candidate  # one stage's sub-mesh and its placement inside the stage
    microbatches: int
    recompute: str
    represented_by: tuple[int, ...]  # per layer of the whole graph, the sample position pricing it
    beat_s: float = math.inf  # refit to the memory budget only a plan that might beat this step
    # the sample to solve when not the search's own: a compared layout's, its shardings pinned
    graph_document: dict[str, Any] | None = field(default=None, compare=False, repr=False)

    @property
    def devices(self) -> int:
        return self.stages * math.prod(self.candidate.axis_sizes)


def solve_sample_task(inputs: SearchInputs, task: SampleTask, time_limit_s: float) -> dict[str, Any]:
    """`{"prices": [LayerPrices, ...], "bound_s": ..., "roles": ..., "solver": ...}` or why there
    is none (`"infeasible"`, `"unsolved"`)."""
    placement = bind_stages(inputs.topology, task.devices, task.stages, task.candidate)
    if placement is None:
        return {"infeasible": f"{STAGE_AXIS}={task.stages} and this sub-mesh do not bind to the machine together"}
    mesh, hw = task.candidate.mesh, placement.hardware
    try:
        document = task.graph_document if task.graph_document is not None else inputs.graph_document
        graph = with_recomputation(load_graph(document, mesh), task.recompute, mesh)
    except InputError as error:  # a constraint of the graph names an axis this sub-mesh lacks
        return {"infeasible": f"the graph's constraints do not fit this sub-mesh: {error}"}
    budget = inputs.settings.memory_budget_bytes or hw.hbm_bytes
    settings = dataclasses.replace(inputs.settings, microbatches=task.microbatches, time_limit_s=time_limit_s)
    fit = step_orders("1f1b", task.stages, task.microbatches)
    captured: list[Formulation] = []

    def keep(formulation: Formulation) -> Formulation:
        captured.append(formulation)
        return formulation

    unlimited = dataclasses.replace(settings, memory_budget_bytes=MAX_MEMORY_BUDGET_BYTES)
    prices = resharding_prices(mesh, hw)  # shared by the start's formulation and the free one
    start = (None if task.graph_document is not None
             else _published_start(document, task, inputs.topology, hw, unlimited, prices))
    found: list[LayerPrices] = []
    plans = []
    first = None
    whole = MAX_MEMORY_BUDGET_BYTES
    for _ in range(SOLVES):
        try:
            result = make_plan(graph, mesh, hw, dataclasses.replace(settings, memory_budget_bytes=whole),
                               prices=prices, memory=keep if first is None else None, step_lists=False,
                               start=start.plan if start is not None else None, formulated_before=captured or None)
        except InfeasibleError as error:
            if first is None:
                return {"infeasible": str(error)}
            break  # nothing fits the shrunk budget: the plans found stand
        except OutOfTime as error:
            if first is None:
                return {"unsolved": str(error)}
            break
        first = first or result
        per_layer = layer_prices(result)
        found.append(per_layer)
        plans.append(result.plan)
        fitted = price_layers(per_layer, task.represented_by, fit, hw if task.stages > 1 else None)
        least_s = per_layer.serial_s(task.represented_by, task.microbatches) / task.stages
        if fitted.peak_bytes <= budget or least_s * (1 - (first.solver.get("gap") or 0.0)) >= task.beat_s:
            break
        whole = result.report.peak_memory_bytes * budget / fitted.peak_bytes * FIT_MARGIN
    assert first is not None
    if start is not None:  # a variant of its own: the refits' budgets need not leave it room
        found.append(layer_prices(start))
        plans.append(start.plan)
    return {"prices": found, "bound_s": _bound_s(captured[0], task, inputs), "solver": {
        "status": first.solver["status"], "gap": first.solver.get("gap"), "solves": len(found),
        "formulations": 1 + (start is not None),  # the refits solve the first formulation under other budgets
        "formulate_s": first.solver.get("formulate_s"), "solve_s": first.solver.get("solve_s")},
        "roles": [plan_roles(plan).axes(mesh.axis_names) for plan in plans]}


def _published_start(document: dict[str, Any], task: SampleTask, topology: str, hw: Hardware,
                     settings: SolveSettings, prices: ReshardingPrices) -> PlanResult | None:
    """The sample planned with the layout published runs use pinned on this sub-mesh
    (`_published_layout`), the rest (the optimizer state among it) solved. The free solves start
    from it and a schedule may take it: a layout real runs use bounds what the key's short solves
    return, which under the memory refits of a deep pipeline can otherwise be far from it. None
    where the layout does not exist on this sub-mesh (heads, features or experts not divisible)
    or finds no plan."""
    mesh = task.candidate.mesh
    hints = _published_layout(document, mesh.axis_names, task.candidate.axis_sizes,
                              slow_axes(topology, task.candidate))
    if not any(c["tensor"].startswith("layer") for c in hints):
        return None
    pinned = dict(document, constraints=list(document.get("constraints", [])) + hints)
    try:
        graph = with_recomputation(load_graph(pinned, mesh), task.recompute, mesh)
        return make_plan(graph, mesh, hw, settings, prices=prices, step_lists=False)
    except (InputError, InfeasibleError, OutOfTime):
        return None


def routed_step(document: dict[str, Any]) -> bool:
    """Whether a step's layers route to experts (`generate gpt --style llama --moe-experts N`)."""
    return layer_style(document) == "llama" and routed_experts(document) > 0


def published_data_axes(routed: bool, axes: tuple[str, ...], slow: tuple[str, ...]) -> tuple[str, ...]:
    """The axes the published layout of a step on this sub-mesh splits its batch over
    (`_published_layout`): every axis with routed experts, else those between nodes or slices."""
    return axes if routed else tuple(a for a in axes if a in slow)


def _published_layout(document: dict[str, Any], axes: tuple[str, ...], sizes: tuple[int, ...],
                      slow: tuple[str, ...]) -> list[dict[str, Any]]:
    """Megatron-LM's layout of a dense step, by the value names of `generate gpt --style megatron`
    or `--style llama`: tensor parallelism (with sequence-parallel norms) over the axes inside a
    node or slice, the batch over those between them. A step with routed experts is laid out as
    Mixtral's and DeepSeek-V3's runs are: no tensor parallelism, the batch over every axis, and
    the experts over the axes of the widest degree that divides them (the fewest slow axes among
    equals): the least expert weight a device holds."""
    style = layer_style(document)
    experts = routed_experts(document) if style == "llama" else 0
    data = published_data_axes(experts > 0, axes, slow)
    tensor = tuple(a for a in axes if a not in data)
    if style == "megatron":
        return megatron_constraints(document, bool(tensor), bool(data), tensor_axes=tensor, data_axes=data)
    if style == "gpt":  # no published layout by its value names
        return []
    if not experts:
        return llama_constraints(document, bool(tensor), data, tensor_axes=tensor)
    size_of = dict(zip(axes, sizes))
    subsets = [subset for count in range(len(axes) + 1) for subset in itertools.combinations(axes, count)]
    widest = max((s for s in subsets if experts % math.prod(size_of[a] for a in s) == 0),
                 key=lambda s: (math.prod(size_of[a] for a in s), -len(set(s) & set(slow))))
    return llama_constraints(document, False, data, expert_axes=widest)


def _bound_s(formulation: Formulation, task: SampleTask, inputs: SearchInputs) -> float:
    """The module docstring's bound on the whole graph's serial step seconds on this sub-mesh."""
    weights = inputs.settings.weights
    if weights.comm_s_per_byte or not weights.time:
        return 0.0  # communicated bytes have no ceiling to take off
    problem, graph = formulation.problem, formulation.graph
    positions = op_positions(graph)
    counts = np.bincount(np.asarray(task.represented_by), minlength=max(positions.values()) + 1)
    incoming = [np.zeros(len(costs), dtype=np.int64) for costs in problem.node_costs]
    for (u, v), matrix in zip(problem.edges, problem.edge_costs):
        incoming[int(v)] += matrix.min(axis=0)
    total_ps = 0.0
    for (kind, name), costs, extra in zip(formulation.nodes, problem.node_costs, incoming):
        total_ps += counts[positions[name] if kind == "op" else _tensor_position(graph, name, positions)] \
            * int((costs + extra).min())
    # the objective's other terms at their most: every value held whole once per microbatch
    ps_per_byte = weights.memory_s_per_byte * PICOSECONDS + TIE_BREAK_PS_PER_BYTE
    held = sum(counts[_tensor_position(graph, t.name, positions)] * t.bytes for t in graph.tensors.values())
    return max(total_ps - task.microbatches * held * ps_per_byte, 0.0) / PICOSECONDS / weights.time


def _tensor_position(graph: Any, tensor: str, positions: dict[str, int]) -> int:
    """The position of the op making a value, or of its first reader (a stored value)."""
    maker = graph.producers.get(tensor)
    if maker is not None:
        return positions[maker.name]
    readers = graph.consumers.get(tensor) or []
    return min((positions[r.name] for r in readers), default=0)
