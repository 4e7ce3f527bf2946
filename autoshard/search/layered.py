"""`search --by-layer`: the whole configuration space of a stack of layers searched from three.

The space: stage counts S (1, and every S > 1 `stage_counts` allows), each stage's sub-mesh (the
candidates on N/S devices, the stage axis outermost), microbatch counts M (`microbatch_counts`),
recomputation modes, and every schedule and virtual-stage count V (`schedules`). A key (S,
sub-mesh, M, recomputation) is one solve of the model's layer sample (`layer_sample`, three
layers for the whole stack; `sample_tasks`), and every schedule of the key is priced from it
(`price_layers`) in milliseconds, so the formulations grow with the keys, not with the layers
or schedules.

Pruning is certified. Before anything is solved each key has an analytic bound: the step is at
least the least compute of every op of the whole step (the sample's ops times the layers they
stand for) spread over all N devices at the chip's best rate (`least_compute_s`). A key whose
bound is at least the best step found is not solved; a schedule whose busiest stage alone takes
that long is not simulated. A solved key's bound is its formulation's (`sample_tasks`) over S, or
the analytic one if larger. A key the time budget leaves unsolved keeps its analytic bound, so
the least bound over all keys bounds every configuration of the space. The order keys are solved
in (`Queue`) only decides where a time budget is spent.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from cost_models import load_profile

from autoshard.errors import InfeasibleError, InputError
from autoshard.graph.model import Graph
from autoshard.graph.recompute import with_recomputation
from autoshard.graph.schema import load_graph
from autoshard.pipeline.step import step_orders
from autoshard.planning.costs import least_compute_s
from autoshard.planning.layer_prices import LayeredParts, LayeredPipeline, LayerPrices, layered_parts, simulate_parts
from autoshard.planning.layer_sample import LayerSample
from autoshard.planning.pipeline_stages import op_positions
from autoshard.planning.roles import tensor_roles
from autoshard.search.candidates import Candidate, enumerate_candidates, slow_axes
from autoshard.search.fanout import open_pool
from autoshard.search.pipelined import batch_sizes, microbatch_counts, schedules, stage_counts
from autoshard.search.run import POLL_S, SearchOptions
from autoshard.search.sample_tasks import SampleTask, published_data_axes, routed_step
from autoshard.search.stage_tasks import StagePlacement, bind_stages
from autoshard.search.tasks import SearchInputs


# The share of the memory budget a key's memory estimate must stay under to be tried early: the
# estimate splits every value over every device, which tensor parallelism does not (Megatron's layer
# keeps its norms' and dropouts' inputs whole: Korthikanti et al. 2022, sbh(10 + 24/t + 5as/ht)).
ESTIMATE_SHARE = 0.8
# Interleaved schedules with V chunks of equal layers, V at most this: more chunks shrink the bubble
# by less than the sends they add cost in launches we do not price (real runs keep V small).
MAX_CHUNKS = 16


@dataclass(frozen=True)
class LayeredConfiguration:
    task: SampleTask
    schedule: str
    chunks: int

    @property
    def schedule_text(self) -> str:
        return f"{self.schedule}:{self.chunks}" if self.schedule == "interleaved" else self.schedule


@dataclass
class KeyOutcome:
    """One key (S, sub-mesh, M, recomputation): solved, pruned, infeasible or unsolved."""

    task: SampleTask
    analytic_bound_s: float
    may_fit: bool = True  # by the memory estimate (`Analytic`), which orders the solves only
    replica_micro: bool = False  # one sample a microbatch per data replica of the published layout (`_keys`)
    outcome: str = "waiting"
    reason: str = ""
    bound_s: float = 0.0  # certified, for every configuration of the key
    solved: dict[str, Any] | None = None


@dataclass
class PricedLayered:
    configuration: LayeredConfiguration
    outcome: str  # priced | over budget (no plan of the key fits) | dominated (its busiest stage alone is slower)
    parts: LayeredParts  # of the plan priced, or of the one needing least memory when none fits
    pipeline: LayeredPipeline | None  # simulated ("priced" only)
    variant: int  # which of the key's plans (0: the fastest; then refitted ones)
    bound_s: float

    @property
    def fits(self) -> bool:
        return self.outcome == "priced"

    @property
    def step_s(self) -> float:
        return self.pipeline.step_s if self.pipeline is not None else math.inf


@dataclass
class LayeredSearch:
    keys: list[KeyOutcome]
    priced: list[PricedLayered]  # fitting first, fastest first; then over the budget
    certified_bound_s: float  # no configuration of the space has a plan with a shorter step
    wall_s: float
    formulations: int
    counts: dict[str, int] = field(default_factory=dict)
    compared: dict[str, Any] | None = None  # the compared task's answer (`solve_sample_task`'s)

    @property
    def best(self) -> PricedLayered | None:
        return self.priced[0] if self.priced and self.priced[0].fits else None

    @property
    def gap(self) -> float | None:
        best = self.best
        return None if best is None else max(best.step_s - self.certified_bound_s, 0.0) / best.step_s


KeyProgress = Callable[[int, int, KeyOutcome], None]


def search_layered(sample: LayerSample, options: SearchOptions, modes: tuple[str, ...],
                   progress: KeyProgress | None = None, stages: int | None = None,
                   compared: SampleTask | None = None) -> LayeredSearch:
    """Every configuration of the space priced from the sample's solves, ranked (module docstring).
    `compared` (a layout the user compares, its own sample) is solved first, beside the keys,
    within the same budget; its answer is `LayeredSearch.compared`."""
    started = time.perf_counter()
    deadline = started + (options.time_budget_s or math.inf)
    layers = len(sample.layers)
    graph = load_graph(sample.document)
    counts = [1] + stage_counts(options.devices, layers) if stages is None else [stages]
    keys = _keys(sample, options, modes, counts, graph)
    budget = options.settings.memory_budget_bytes
    best_step = math.inf
    priced: list[PricedLayered] = []
    placements: dict[tuple[int, Candidate], StagePlacement | None] = {}
    pool = open_pool(SearchInputs(sample.document, options.topology, options.settings), options.jobs, options.ray)
    running: dict[Any, KeyOutcome] = {}
    queue = Queue(keys)
    done = 0
    theirs = KeyOutcome(compared, 0.0) if compared is not None else None
    if theirs is not None:
        running[pool.submit("sample", compared, options.settings.time_limit_s)] = theirs
    try:
        while queue or running:
            while queue and len(running) < pool.slots:
                key = queue.pop()
                if key.analytic_bound_s >= best_step:
                    key.outcome, key.reason = "pruned", "its bound is at least the best step found"
                    continue
                remaining_s = deadline - time.perf_counter()
                if remaining_s <= 0:  # every key left at once: a pop looks at all of them
                    _out_of_time([key, *queue.drain()], best_step)
                    continue
                task = dataclasses.replace(key.task, beat_s=best_step)
                running[pool.submit("sample", task, min(options.settings.time_limit_s, remaining_s))] = key
            if running and time.perf_counter() > deadline:  # the budget is the user's wait: stop the stragglers
                _out_of_time(list(running.values()), best_step, "the search's time budget ended while it was solved")
                _out_of_time(queue.drain(), best_step)
                break
            for handle in pool.wait(list(running), POLL_S):
                key = running.pop(handle)
                answer = pool.result(handle)
                if key is theirs:
                    theirs.solved = answer
                    continue
                done += 1
                if "prices" in answer:
                    key.outcome, key.solved = "solved", answer
                    key.bound_s = max(answer["bound_s"] / key.task.stages, key.analytic_bound_s)
                    where = placements.setdefault((key.task.stages, key.task.candidate), bind_stages(
                        options.topology, key.task.devices, key.task.stages, key.task.candidate))
                    found = price_key(key, answer["prices"], sample, where, budget, best_step)
                    priced += found
                    best_step = min([best_step] + [p.step_s for p in found])
                    queue.learn(key, min((p.step_s if p.fits else p.parts.busy_floor_s() for p in found),
                                         default=math.inf))
                else:
                    key.outcome = next(iter(answer))
                    key.reason = answer[key.outcome]
                if progress:
                    progress(done, len(keys), key)
    finally:
        pool.close(cancel=list(running))  # what still runs: keys the budget or an error stopped
    priced.sort(key=lambda p: (not p.fits, p.step_s, p.bound_s, p.configuration.task.stages,
                               p.configuration.task.microbatches, p.configuration.chunks))
    floors = [k.bound_s if k.outcome == "solved" else k.analytic_bound_s for k in keys if k.outcome != "infeasible"]
    tally = {outcome: sum(1 for k in keys if k.outcome == outcome)
             for outcome in ("solved", "pruned", "infeasible", "unsolved")}
    formulations = sum(k.solved["solver"]["formulations"] for k in keys if k.solved)
    configurations = {outcome: sum(1 for p in priced if p.outcome == outcome)
                      for outcome in ("priced", "over budget", "dominated")}
    if theirs is not None and theirs.solved is None:
        theirs.solved = {"unsolved": "the search's time budget ended while it was solved"}
    return LayeredSearch(keys, priced, min(floors, default=0.0), time.perf_counter() - started, formulations,
                         {"keys": len(keys), **tally, "configurations": configurations},
                         theirs.solved if theirs is not None else None)


def _out_of_time(keys: list[KeyOutcome], best_step_s: float, why: str = "the search's time budget was spent") -> None:
    for key in keys:
        key.outcome, key.reason = (("pruned", "its bound is at least the best step found")
                                   if key.analytic_bound_s >= best_step_s else ("unsolved", why))


def _keys(sample: LayerSample, options: SearchOptions, modes: tuple[str, ...], counts: list[int],
          graph: Graph) -> list[KeyOutcome]:
    analytic = _analytic(graph, sample, options, modes, counts)
    budget = options.settings.memory_budget_bytes
    batches = batch_sizes(graph)
    routed = routed_step(sample.document)
    keys = []
    for stages in counts:
        try:
            candidates = enumerate_candidates(options.topology, options.devices // stages, max_axes=options.max_axes,
                                              fixed=options.fixed).candidates
        except InputError:  # the fixed axes do not divide a stage's devices
            continue
        limit = budget if budget is not None else _hbm_bytes(options.topology)
        for candidate in candidates:
            slow = slow_axes(options.topology, candidate)
            size_of = dict(zip(candidate.axis_names, candidate.axis_sizes))
            replicas = math.prod(size_of[a] for a in slow)
            samples = math.prod(size_of[a] for a in published_data_axes(routed, candidate.axis_names, slow))
            for microbatches in microbatch_counts(stages, batches, candidate.axis_sizes):
                for mode in modes:
                    estimate = analytic[mode].memory_estimate_bytes(options.devices, stages, microbatches, replicas)
                    keys.append(KeyOutcome(SampleTask(stages, candidate, microbatches, mode, sample.represented_by),
                                           analytic[mode].bound_s(), may_fit=estimate <= limit * ESTIMATE_SHARE,
                                           replica_micro=bool(batches) and (stages > 1 or samples > 1)
                                           and math.gcd(*batches) == microbatches * samples))
    if not keys:
        raise InputError(f"no stage count and sub-mesh of {options.devices} devices fits the fixed axes "
                         f"{options.fixed}", "fix")
    return keys


class Queue:
    """The keys in the order they are solved, so a time budget is spent where the winner likely is.

    Two kinds of pops alternate while both have keys. Exploring: one key of each (stage count,
    sub-mesh) pair not tried yet, its most promising (`_promise`), those whose memory estimate
    fits first, the stage counts taking turns (each one's best pair, then each one's second,
    ...), so every depth of pipeline and every sub-mesh is tried once. Refining: another key of
    the most promising pair tried (`learn`: the least of a pair's steps found so far, or for a
    schedule whose plans did not fit, the busy seconds of its busiest stage: another
    recomputation or microbatch count may make it fit), each pair's keys by promise. Refining
    from the start matters on large machines, where trying every pair once takes most of a time
    budget."""

    def __init__(self, keys: list[KeyOutcome]):
        self.pending = sorted(keys, key=_promise)
        self.best: dict[tuple[int, Candidate], float] = {}
        self.tried: set[tuple[int, Candidate]] = set()
        by_stages: dict[int, list[tuple[int, Candidate]]] = {}
        for key in self.pending:
            pair = _pair(key)
            if pair not in by_stages.setdefault(pair[0], []):
                by_stages[pair[0]].append(pair)
        self.turn = {pair: i for pairs in by_stages.values() for i, pair in enumerate(pairs)}
        self.refine = False  # the kind of the next pop, when both kinds have keys

    def __len__(self) -> int:
        return len(self.pending)

    def pop(self) -> KeyOutcome:
        untried = [key for key in self.pending if _pair(key) not in self.tried]
        learnt = [key for key in self.pending if _pair(key) in self.best]
        if untried and not (self.refine and learnt):
            key = min(untried, key=lambda k: (not k.may_fit, self.turn[_pair(k)], _promise(k)))
        else:
            key = min(learnt or self.pending, key=lambda k: (self.best.get(_pair(k), math.inf), _promise(k)))
        self.refine = not self.refine
        self.pending.remove(key)
        self.tried.add(_pair(key))
        return key

    def drain(self) -> list[KeyOutcome]:
        """Every key not yet popped, the queue left empty."""
        left, self.pending = self.pending, []
        return left

    def learn(self, key: KeyOutcome, step_s: float) -> None:
        pair = _pair(key)
        self.best[pair] = min(self.best.get(pair, math.inf), step_s)


def _pair(key: KeyOutcome) -> tuple[int, Candidate]:
    return key.task.stages, key.task.candidate


def _promise(key: KeyOutcome) -> tuple:
    """The order keys are solved in, so the keys likely to win come first and prune the rest
    sooner. First the microbatch count giving each data replica of the published layout one
    sample (`published_data_axes`): for a dense step, data parallelism along the slow links
    (between nodes or slices) and the rest of the batch split inside the node, whose links carry
    the per-layer traffic of tensor parallelism an order of magnitude faster (a pipeline whose
    stages hold no slow link, one sample a microbatch); with routed experts, one sample a
    device; then those whose memory estimate fits, then by their bound stretched by the
    least bubble of their best schedule, (S - 1) / (M V) of the busy time (V as large as the
    layers allow); fewer axes first at a tie."""
    task = key.task
    chunks = max(len(task.represented_by) // task.stages, 1) if task.microbatches % task.stages == 0 else 1
    bubble = (task.stages - 1) / (task.microbatches * chunks)
    return (not key.replica_micro, not key.may_fit, key.analytic_bound_s * (1 + bubble),
            len(task.candidate.axis_sizes), task.stages, task.microbatches)


@dataclass(frozen=True)
class Analytic:
    """What a mode's whole step needs before any plan: its least compute over all devices, the
    bytes it stores (parameters, optimizer state, gradients) and the bytes one batch leaves saved
    for the backward, each summed over the whole stack from the sample."""

    least_compute_s: float
    weight_bytes: float  # parameters and their gradients
    state_bytes: float  # the optimizer's (master weights and moments)
    saved_bytes: float

    def bound_s(self) -> float:
        """A stage of N/S devices computes its ops at least S times as long as N devices would,
        and the busiest of S stages holds at least 1/S of them: the same bound for every S."""
        return self.least_compute_s

    def memory_estimate_bytes(self, devices: int, stages: int, microbatches: int, replicas: int = 1) -> float:
        """Not a bound, an order: weights and gradients whole on each of the `replicas` data
        replicas between nodes (as the layouts that keep slow links for the gradient reduction
        hold them: Megatron-LM's distributed optimizer, 6 + 12/d bytes a parameter), everything
        else stored split over every device, and 1F1B's first stage holding min(S, M)
        microbatches of its 1/S of the saved values, split over its N / S devices (which no
        layout quite reaches: `_keys` wants it under `ESTIMATE_SHARE` of the budget)."""
        saved = self.saved_bytes / microbatches * min(stages, microbatches)
        return (self.weight_bytes * replicas + self.state_bytes + saved) / devices


def _analytic(graph: Graph, sample: LayerSample, options: SearchOptions, modes: tuple[str, ...],
              counts: list[int]) -> dict[str, Analytic]:
    hardware = None
    for stages in counts:
        try:
            candidate = enumerate_candidates(options.topology, options.devices // stages, max_axes=1).candidates[0]
        except InputError:
            continue
        placement = bind_stages(options.topology, options.devices, stages, candidate)
        if placement is not None:
            hardware = placement.hardware
            break
    if hardware is None:
        raise InfeasibleError(f"no stage count binds {options.devices} devices of {options.topology}")
    out = {}
    for mode in modes:
        step = with_recomputation(graph, mode)
        positions = op_positions(step)
        weight = {op.name: sample.counts[positions[op.name]] for op in step.ops}
        seconds = sum(weight[op.name] * least_compute_s(step, op, options.devices, hardware) for op in step.ops)
        roles, phases = tensor_roles(step), step.phases
        weights = state = saved = 0.0
        for tensor in step.tensors.values():
            maker = step.producers.get(tensor.name)
            readers = step.consumers[tensor.name]
            times = weight[maker.name] if maker is not None else max((weight[r.name] for r in readers), default=1)
            if roles[tensor.name] in ("parameter", "gradient") and tensor.updates is None:
                weights += times * tensor.bytes
            elif roles[tensor.name] == "optimizer_state" and tensor.updates is None:
                state += times * tensor.bytes
            elif maker is not None and phases[maker.name] == "forward" and any(
                    phases[r.name] == "backward" for r in readers):
                saved += times * tensor.bytes
        out[mode] = Analytic(seconds, weights, state, saved)
    return out


def price_key(key: KeyOutcome, found: list[LayerPrices], sample: LayerSample, placement: StagePlacement | None,
              budget: float | None, best_s: float, only: tuple[str, int] | None = None) -> list[PricedLayered]:
    """Every schedule of a solved key (or the one `only` names), on whichever of the key's plans
    is fastest within the budget: simulated unless no plan fits (`over budget`) or its busiest
    stage alone takes at least `best_s` (`dominated`: it cannot win)."""
    task = key.task
    assert placement is not None, "the worker bound the same machine"
    hw = placement.hardware
    limit = budget if budget is not None else hw.hbm_bytes
    layers = len(sample.layers)
    out = []
    pairs = [only] if only is not None else [("1f1b", 1)] if task.stages == 1 else [
        (name, chunks) for name, chunks in schedules(task.stages, layers, task.microbatches)
        if chunks == 1 or (layers // task.stages % chunks == 0 and chunks <= MAX_CHUNKS)]
    for schedule, chunks in pairs:
        configuration = LayeredConfiguration(task, schedule, chunks)
        orders = step_orders(schedule, task.stages, task.microbatches, chunks)
        cut = [(variant, layered_parts(prices, sample.represented_by, orders, hw if task.stages > 1 else None))
               for variant, prices in enumerate(found)]
        fitting = [(variant, parts) for variant, parts in cut if parts.peak_bytes <= limit]
        if not fitting:
            variant, parts = min(cut, key=lambda vp: vp[1].peak_bytes)
            out.append(PricedLayered(configuration, "over budget", parts, None, variant, key.bound_s))
            continue
        floors = [(parts.busy_floor_s(), variant, parts) for variant, parts in fitting]
        floor, variant, parts = min(floors, key=lambda fvp: fvp[0])
        if floor >= best_s:
            out.append(PricedLayered(configuration, "dominated", parts, None, variant, max(key.bound_s, floor)))
            continue
        priced = min(((variant, simulate_parts(parts)) for _, variant, parts in floors if _ < best_s),
                     key=lambda vp: vp[1].step_s)
        out.append(PricedLayered(configuration, "priced", priced[1].parts, priced[1], priced[0], key.bound_s))
        best_s = min(best_s, priced[1].step_s)
    return out


def _hbm_bytes(topology: str) -> float:
    return load_profile(topology).hbm_bytes
