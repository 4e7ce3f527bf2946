"""`search --pipeline auto`: stages, microbatches, virtual stages and schedule chosen together with
the mesh inside a stage.

For each stage count S dividing the devices (2 <= S <= layers, at least 2 devices a stage), each
candidate sub-mesh of N/S devices (`enumerate_candidates`, placed on the machine under the stage
axis `pp`, outermost) and each microbatch count M of (1, S, 2S, 4S) the batch can be split into:
one intra-stage plan (`stage_plan`), then every schedule priced on that one plan
(`price_pipeline`: the cut by the dynamic programme over its per-layer seconds, no range planned
again, the event simulation, each stage's memory against the budget). S = 1 is the plain search,
whose winner competes on its step. Configurations are ranked by the simulated step.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Any

from autoshard.errors import InfeasibleError, InputError, OutOfTime
from autoshard.graph.model import Graph
from autoshard.graph.schema import load_graph
from autoshard.planning.formulation import PICOSECONDS, TIE_BREAK_PS_PER_BYTE, Weights
from autoshard.planning.hardware import bind_hardware
from autoshard.planning.make_plan import PlanResult, SolveSettings
from autoshard.planning.pipeline_plan import (STAGE_AXIS, PipelinedPlan, PipelineSettings, checked_orders,
                                              pipeline_mesh, price_pipeline, stage_budget_bytes, stage_plan)
from autoshard.planning.pipeline_stages import layer_order
from autoshard.search.candidates import Candidate, enumerate_candidates, machines_for
from autoshard.search.run import SearchOptions, SearchResult

MICROBATCHES_PER_STAGE = (1, 2, 4)  # M = S, 2S, 4S (and M = 1): enough to amortise the bubble, few solves


@dataclass(frozen=True)
class Configuration:
    stages: int
    candidate: Candidate  # one stage's sub-mesh and its placement inside the stage
    microbatches: int
    schedule: str
    chunks: int  # virtual stages per stage

    @property
    def schedule_text(self) -> str:
        return f"{self.schedule}:{self.chunks}" if self.schedule == "interleaved" else self.schedule


@dataclass(frozen=True)
class StagePlacement:
    """The machine bound as `pp=S` then the sub-mesh, and where (as `deliver` records it)."""

    hardware: Any
    nodes: int
    slice_shape: tuple[int, ...] | None
    mapping: dict[str, list[str]]


@dataclass
class Priced:
    """One configuration: its pipelined plan (`outcome` "priced"), or why it has none."""

    configuration: Configuration
    outcome: str  # priced | infeasible | unsolved
    bound_s: float  # no plan of this configuration (its cut) has a shorter step
    reason: str = ""
    pipelined: PipelinedPlan | None = None
    placement: StagePlacement | None = None

    @property
    def step_s(self) -> float:
        assert self.pipelined is not None
        return self.pipelined.timeline.step_s


@dataclass
class PipelineSearch:
    priced: list[Priced]  # priced by step first, then the rest
    plain: SearchResult  # S = 1
    best: Priced | None  # None: the plain search's winner has the shortest step
    certified_bound_s: float  # no configuration's plan has a shorter step (S = 1 included)

    @property
    def plain_step_s(self) -> float | None:
        return self.plain.best.solved["step_s"] if self.plain.best is not None else None


def search_pipelines(graph_document: dict[str, Any], options: SearchOptions, plain: SearchResult) -> PipelineSearch:
    """Every pipelined configuration priced and ranked beside the plain search's winner."""
    layers = len(layer_order(load_graph(graph_document)))
    priced: list[Priced] = []
    for stages in stage_counts(options.devices, layers):
        try:
            candidates = enumerate_candidates(options.topology, options.devices // stages,
                                              max_axes=options.max_axes, fixed=options.fixed).candidates
        except InputError:  # the fixed axes do not divide a stage's devices: no sub-mesh of this S
            continue
        for candidate in candidates:
            priced += _price_sub_mesh(graph_document, options, stages, candidate, layers)
    priced.sort(key=_rank_order)
    found = [p for p in priced if p.outcome == "priced"]
    plain_step = plain.best.solved["step_s"] if plain.best is not None else None
    best = found[0] if found and (plain_step is None or found[0].step_s < plain_step) else None
    floors = [p.bound_s for p in priced if p.outcome != "infeasible"]
    if plain.best is not None or plain.counts["unsolved"]:  # else the plain search proved S = 1 has no plan
        floors.append(plain_step_bound_s(plain, load_graph(graph_document), options.settings.weights))
    return PipelineSearch(priced, plain, best, min(floors, default=0.0))


def stage_counts(devices: int, layers: int) -> list[int]:
    """S > 1 dividing the devices, at most one stage per layer, at least 2 devices a stage (a
    sub-mesh of one device has no candidate mesh yet)."""
    return [s for s in range(2, min(layers, devices // 2) + 1) if devices % s == 0]


def microbatch_counts(stages: int) -> list[int]:
    return [1] + [stages * k for k in MICROBATCHES_PER_STAGE]


def schedules(stages: int, layers: int, microbatches: int) -> list[tuple[str, int]]:
    """1F1B, ZB-H1 and interleaved with V = 2 .. layers / S (M a multiple of S, as it needs)."""
    found = [("1f1b", 1), ("zb-h1", 1)]
    if microbatches % stages == 0:
        found += [("interleaved", v) for v in range(2, layers // stages + 1)]
    return found


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


def _price_sub_mesh(graph_document: dict[str, Any], options: SearchOptions, stages: int, candidate: Candidate,
                    layers: int) -> list[Priced]:
    """Every (M, schedule) of one S and sub-mesh, one intra-stage plan per M."""
    placement = bind_stages(options.topology, options.devices, stages, candidate)
    try:
        graph = load_graph(graph_document, candidate.mesh)
    except InputError as error:  # a constraint of the graph names an axis this sub-mesh lacks
        graph, reason = None, f"the graph's constraints do not fit this sub-mesh: {error}"
    if placement is None:
        reason = f"{STAGE_AXIS}={stages} and this sub-mesh do not bind to the machine together"
    rows = []
    for microbatches in microbatch_counts(stages):
        found = [Configuration(stages, candidate, microbatches, name, chunks)
                 for name, chunks in schedules(stages, layers, microbatches)]
        if graph is None or placement is None:
            rows += [Priced(c, "infeasible", 0.0, reason) for c in found]
            continue
        settings = replace(options.settings, microbatches=microbatches)
        try:
            result = stage_plan(graph, candidate.mesh, placement.hardware, settings, stages)
        except InputError:  # the batch does not split into M microbatches: not a configuration
            continue
        except InfeasibleError as error:
            rows += [Priced(c, "infeasible", 0.0, str(error)) for c in found]
            continue
        except OutOfTime as error:
            rows += [Priced(c, "unsolved", 0.0, str(error)) for c in found]
            continue
        rows += [_priced(c, graph, result, placement, settings) for c in found]
    return rows


def _priced(configuration: Configuration, graph: Graph, result: PlanResult, placement: StagePlacement,
            settings: SolveSettings) -> Priced:
    orders = checked_orders(graph, PipelineSettings(configuration.stages, configuration.schedule,
                                                    configuration.chunks), configuration.microbatches)
    bound_s = pipelined_step_bound_s(result, graph, settings.weights, configuration)
    try:
        pipelined = price_pipeline(result, configuration.candidate.mesh, placement.hardware, orders,
                                   stage_budget_bytes(settings, placement.hardware))
    except InfeasibleError as error:  # a stage over the budget with this plan; another plan might fit: bound kept
        return Priced(configuration, "over budget", bound_s, str(error))
    return Priced(configuration, "priced", bound_s, pipelined=pipelined, placement=placement)


def pipelined_step_bound_s(result: PlanResult, graph: Graph, weights: Weights, configuration: Configuration) -> float:
    """The certified bound on the step of every plan of this configuration.

    The simulation is monotone in every stage's seconds, and a stage runs its items and tail one
    at a time, so the step is at least the busiest stage's busy seconds. The solver certifies a
    bound on the whole graph's serial seconds on the stage mesh (every op over the M microbatches
    and the once-per-step tail), not one per stage: those seconds are the sum of the stages' busy
    seconds under any cut, so the busiest stage holds at least 1/S of them. Each stage is bounded
    by that average (the bound is the simulation with every stage at its share and free transfers,
    which also bounds plans cutting elsewhere); no split in proportion to the found plan's layers,
    which another plan of the configuration need not follow."""
    return step_bound_s(result.solver["lower_bound_ps"], graph, weights, configuration.microbatches) \
        / configuration.stages


def plain_step_bound_s(plain: SearchResult, graph: Graph, weights: Weights) -> float:
    return step_bound_s(plain.certified_bound_ps, graph, weights, 1)


def step_bound_s(objective_bound_ps: float, graph: Graph, weights: Weights, microbatches: int) -> float:
    """A bound on the serial step seconds from a bound on the objective: the objective's other
    terms (bytes held, the tie-break) are taken off at their most, every value held whole once per
    microbatch. Communicated bytes have no such ceiling, so a weight on them leaves only 0."""
    if weights.comm_s_per_byte or not weights.time:
        return 0.0
    held_bytes = microbatches * sum(t.bytes for t in graph.tensors.values())
    extra_ps = held_bytes * (weights.memory_s_per_byte * PICOSECONDS + TIE_BREAK_PS_PER_BYTE)
    return max(objective_bound_ps - extra_ps, 0.0) / PICOSECONDS / weights.time


def _rank_order(priced: Priced) -> tuple:
    """Priced by step, at equal step fewer stages, then fewer microbatches; the rest by bound."""
    c = priced.configuration
    key = (c.stages, c.microbatches, c.schedule_text, len(c.candidate.axis_sizes), c.candidate.label)
    return (0, priced.step_s, *key) if priced.outcome == "priced" else (1, priced.bound_s, *key)
