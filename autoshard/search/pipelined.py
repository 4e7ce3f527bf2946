"""`search --pipeline auto`: stages, microbatches, virtual stages and schedule chosen together with
the mesh inside a stage.

For each stage count S dividing the devices (2 <= S <= layers, at least 2 devices a stage), each
candidate sub-mesh of N/S devices (`enumerate_candidates`, placed on the machine under the stage
axis `pp`, outermost) and each microbatch count M the batch can be split into (1, S, 2S, 4S, and one
sample a microbatch per replica along the sub-mesh's axes, `microbatch_counts`):
one intra-stage plan (`stage_plan`, a task on the search's workers), then every schedule priced on it
(`price_pipeline`: the cut by the dynamic programme over its per-layer seconds, no range planned
again, the event simulation, each stage's memory against the budget). S = 1 is the plain search,
whose winner competes on its step. Configurations are ranked by the simulated step.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass
from typing import Any, Callable

from autoshard.errors import InfeasibleError, InputError
from autoshard.graph.model import Graph
from autoshard.graph.schema import load_graph
from autoshard.planning.formulation import PICOSECONDS, TIE_BREAK_PS_PER_BYTE, Weights
from autoshard.planning.make_plan import PlanResult, SolveSettings
from autoshard.planning.pipeline_plan import (PipelinedPlan, PipelineSettings, StageWork, checked_orders,
                                              price_pipeline, stage_budget_bytes)
from autoshard.planning.pipeline_stages import layer_order
from autoshard.search.candidates import Candidate, enumerate_candidates
from autoshard.search.fanout import open_pool
from autoshard.search.run import POLL_S, SearchOptions, SearchResult
from autoshard.search.stage_tasks import StagePlacement, StageTask, bind_stages
from autoshard.search.tasks import SearchInputs

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


@dataclass
class Priced:
    """One configuration: its pipelined plan (`outcome` "priced"), or why it has none."""

    configuration: Configuration
    outcome: str  # priced | over budget (this plan; its bound stands) | infeasible | unsolved
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
        return winner_step_s(self.plain)


def winner_step_s(plain: SearchResult) -> float | None:
    return plain.best.solved["step_s"] if plain.best is not None else None


StageProgress = Callable[[int, int, StageTask, str], None]  # (done, total, task, its outcome)


def search_pipelines(graph_document: dict[str, Any], options: SearchOptions, plain: SearchResult,
                     progress: StageProgress | None = None, stages: int | None = None) -> PipelineSearch:
    """Every pipelined configuration priced and ranked beside the plain search's winner; the
    intra-stage plans solved on the search's workers. `stages`: search that stage count only."""
    graph = load_graph(graph_document)
    layers = len(layer_order(graph))
    if stages is not None:
        check_stage_count(stages, options.devices, layers)
    counts = [stages] if stages is not None else stage_counts(options.devices, layers)
    tasks = stage_tasks(options, layers, batch_sizes(graph), counts)
    solved = _solve_all(SearchInputs(graph_document, options.topology, options.settings), tasks, options,
                        plain.wall_s, progress)
    priced: list[Priced] = []
    for task in tasks:
        found = [Configuration(task.stages, task.candidate, task.microbatches, name, chunks)
                 for name, chunks in schedules(task.stages, layers, task.microbatches)]
        placement = bind_stages(options.topology, options.devices, task.stages, task.candidate)
        priced += _outcomes(found, solved[task], graph, options.settings, placement)
    priced.sort(key=_rank_order)
    found_plans = [p for p in priced if p.outcome == "priced"]
    plain_step = winner_step_s(plain)
    best = found_plans[0] if found_plans and (plain_step is None or found_plans[0].step_s < plain_step) else None
    floors = [p.bound_s for p in priced if p.outcome != "infeasible"]
    if plain.best is not None or plain.counts["unsolved"]:  # else the plain search proved S = 1 has no plan
        floors.append(plain_step_bound_s(plain, graph, options.settings.weights))
    return PipelineSearch(priced, plain, best, min(floors, default=0.0))


def stage_tasks(options: SearchOptions, layers: int, batches: set[int], counts: list[int]) -> list[StageTask]:
    """One intra-stage plan per S of `counts`, sub-mesh (the search's candidates on N/S devices) and M."""
    tasks = []
    for stages in counts:
        try:
            candidates = enumerate_candidates(options.topology, options.devices // stages,
                                              max_axes=options.max_axes, fixed=options.fixed).candidates
        except InputError:  # the fixed axes do not divide a stage's devices: no sub-mesh of this S
            continue
        tasks += [StageTask(stages, c, m) for c in candidates
                  for m in microbatch_counts(stages, batches, c.axis_sizes)]
    return tasks


def _solve_all(inputs: SearchInputs, tasks: list[StageTask], options: SearchOptions, spent_s: float,
               progress: StageProgress | None) -> dict[StageTask, dict]:
    """Each task's answer; under a time budget (`spent_s` of it gone to the plain search) each
    solve's limit is cut to what is left, and a task left when it is spent is unsolved."""
    deadline = time.perf_counter() - spent_s + (options.time_budget_s or math.inf)
    pool = open_pool(inputs, options.jobs, options.ray)
    running: dict[Any, StageTask] = {}
    solved: dict[StageTask, dict] = {}
    queue = list(tasks)
    try:
        while queue or running:
            while queue and len(running) < pool.slots:
                task, remaining_s = queue.pop(0), deadline - time.perf_counter()
                if remaining_s <= 0:
                    solved[task] = {"unsolved": "the search's time budget was spent"}
                    continue
                running[pool.submit("stage", task, min(options.settings.time_limit_s, remaining_s))] = task
            for handle in pool.wait(list(running), POLL_S):
                task = running.pop(handle)
                solved[task] = pool.result(handle)
                if progress:
                    progress(len(solved), len(tasks), task, next(iter(solved[task])))
    except BaseException:
        pool.close(cancel=list(running))
        raise
    pool.close()
    return solved


def check_stage_count(stages: int, devices: int, layers: int) -> None:
    counts = stage_counts(devices, layers)
    if stages not in counts:
        raise InputError(f"{stages} stages do not fit: S must divide the {devices} devices, leave at least 2 a stage "
                         f"and be at most the {layers} layers (possible: {counts})", "pipeline")


def stage_counts(devices: int, layers: int) -> list[int]:
    """S > 1 dividing the devices, at most one stage per layer, at least 2 devices a stage (a
    sub-mesh of one device has no candidate mesh yet)."""
    return [s for s in range(2, min(layers, devices // 2) + 1) if devices % s == 0]


def batch_sizes(graph: Graph) -> set[int]:
    """The batch of every input declaring one (microbatches split them all)."""
    return {t.shape[t.batch_dim] for t in graph.tensors.values() if t.batch_dim is not None}


def microbatch_counts(stages: int, batches: set[int], axis_sizes: tuple[int, ...] = ()) -> list[int]:
    """1, S, 2S and 4S, and the counts giving each replica along some of the sub-mesh's axes one
    sample a microbatch (how published runs are set: micro-batch 1 on every data-parallel rank);
    at least S (fewer leave stages idle every step) and dividing every batch (without a batch: 1).
    With several batches (a routed MoE's token groups beside its samples) a sample is a unit of
    their greatest common divisor."""
    counts = {1} | {stages * k for k in MICROBATCHES_PER_STAGE}
    if batches:
        batch = math.gcd(*batches)
        counts |= {batch // math.prod(chosen) for n in range(len(axis_sizes) + 1)
                   for chosen in itertools.combinations(axis_sizes, n) if batch % math.prod(chosen) == 0}
    return sorted(m for m in counts if m == 1 or (m >= stages and batches and all(b % m == 0 for b in batches)))


def schedules(stages: int, layers: int, microbatches: int) -> list[tuple[str, int]]:
    """GPipe, 1F1B, ZB-H1 and interleaved with V = 2 .. layers / S (M a multiple of S, as it needs)."""
    found = [("gpipe", 1), ("1f1b", 1), ("zb-h1", 1)]
    if microbatches % stages == 0:
        found += [("interleaved", v) for v in range(2, layers // stages + 1)]
    return found


def _outcomes(found: list[Configuration], solved: dict[str, Any], graph: Graph, settings: SolveSettings,
              placement: StagePlacement | None) -> list[Priced]:
    """One (S, sub-mesh, M)'s configurations from its intra-stage plan, or why it has none."""
    if "result" in solved:
        assert placement is not None, "the worker bound the same machine"
        work = StageWork.of(solved["result"])  # the same for every schedule priced on this plan
        return [_priced(c, graph, solved["result"], placement, settings, work) for c in found]
    outcome = "unsolved" if "unsolved" in solved else "infeasible"
    return [Priced(c, outcome, 0.0, solved[outcome]) for c in found]


def _priced(configuration: Configuration, graph: Graph, result: PlanResult, placement: StagePlacement,
            settings: SolveSettings, work: StageWork) -> Priced:
    orders = checked_orders(graph, PipelineSettings(configuration.stages, configuration.schedule,
                                                    configuration.chunks), configuration.microbatches)
    bound_s = pipelined_step_bound_s(result, graph, settings.weights, configuration)
    try:
        pipelined = price_pipeline(result, configuration.candidate.mesh, placement.hardware, orders,
                                   stage_budget_bytes(settings, placement.hardware), work)
    except InfeasibleError as error:  # a stage over the budget with this plan; another plan might fit: bound kept
        return Priced(configuration, "over budget", bound_s, str(error))
    return Priced(configuration, "priced", bound_s, pipelined=pipelined, placement=placement)


def pipelined_step_bound_s(result: PlanResult, graph: Graph, weights: Weights, configuration: Configuration) -> float:
    """The certified bound on the step of every plan of this configuration.

    The simulation is monotone in every stage's seconds, and a stage runs its items and tail one
    at a time, so the step is at least the busiest stage's busy seconds. The solver certifies a
    bound on the whole graph's serial seconds on the stage mesh (every op over the M microbatches
    and the once-per-step tail), not one per stage: those seconds are the sum of the stages' busy
    seconds under any cut, so the busiest stage holds at least 1/S of them: the bound is that
    share, with transfers and bubbles at 0 (it holds for plans cutting elsewhere too). It does not
    split the solver's bound by layer in proportion to the found plan: another plan of the
    configuration need not spread its seconds so. Plans of the configuration are also plans of the
    whole graph within S budgets (`stage_plan`'s problem), so the solver's bound covers them."""
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
