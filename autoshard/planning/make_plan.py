"""Plan a graph: formulate, solve with a certified bound, decode, price, explain infeasibility."""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import numpy as np

from autoshard.errors import InfeasibleError, InputError
from autoshard.graph.model import Graph, topological_order
from autoshard.graph.summary import size
from autoshard.mesh import Mesh
from autoshard.phases import PhaseTimes
from autoshard.planning.costs import Hardware
from autoshard.planning.formulation import (PICOSECONDS, Formulation, ReshardingPrices, Weights, formulate,
                                            resharding_prices)
from autoshard.planning.microbatches import Microbatching, microbatch, repeat_formulation
from autoshard.planning.plan import Plan
from autoshard.planning.report import Report, delivered_shardings, estimate
from autoshard.solver import Problem, score, solve
from autoshard.solver.heuristic import compile_kernels
from autoshard.solver.solve import Result
from autoshard.solver.problem import certified_lower


# Of the time limit, the share spent solving the problem priced use by use before the one with
# shared reshardings
PER_USE_SHARE = 0.5
MAX_SEED = 2 ** 63 - 1  # the solver's kernels take the seed as a 64-bit integer
MAX_MEMORY_BUDGET_BYTES = 2 ** 60  # an exbibyte per device: beyond any chip, inside the solver's int64 rows


@dataclass(frozen=True)
class SolveSettings:
    time_limit_s: float = 30.0
    # Stop once (cost - bound) / cost is at most this: the last 0.01% of a certified bound is
    # rarely worth the rest of the time limit (the default of MIP solvers).
    gap_limit: float = 1e-4
    workers: int = 2
    seed: int = 0
    memory_budget_bytes: float | None = None  # None: the chip's HBM
    weights: Weights = Weights()  # each in seconds of objective per unit it weighs (see `Weights`)
    deterministic: bool = False
    # A dim split over several mesh axes takes them in mesh order only: the plans DTensor's
    # placements can express (`autoshard.frontends.torch`).
    mesh_order_splits: bool = False
    microbatches: int = 1  # forward and backward run on 1/M of the batch, M times; the optimizer once

    def __post_init__(self) -> None:
        if not 0 <= self.seed <= MAX_SEED:
            raise InputError(f"must be in [0, 2**63 - 1], got {self.seed}", "seed")
        if self.weights.problem() is not None:
            raise InputError(self.weights.problem(), "weights")
        problem = memory_budget_problem(self.memory_budget_bytes)
        if problem is not None:
            raise InputError(problem, "memory_budget_bytes")
        if isinstance(self.microbatches, bool) or not isinstance(self.microbatches, int) or self.microbatches < 1:
            raise InputError(f"must be a positive integer, got {self.microbatches!r}", "microbatches")


def memory_budget_problem(budget_bytes: float | None) -> str | None:
    """What is wrong with a per-device memory budget (None: the chip's HBM), or None."""
    if budget_bytes is None or (math.isfinite(budget_bytes) and 0 < budget_bytes <= MAX_MEMORY_BUDGET_BYTES):
        return None
    return f"must be a number of bytes in (0, 2**60], got {budget_bytes:g}"


@dataclass
class PlanResult:
    plan: Plan  # with microbatches, of the step on one microbatch
    report: Report
    solver: dict[str, Any]
    phases: PhaseTimes  # formulate, solve and pricing so far; `deliver` adds its own
    microbatching: Microbatching | None = None  # None: the step runs on the whole batch at once
    # a pipelined step's stage plan solved on a cut: the virtual stage of each layer position
    # (`pipeline_plan.stage_plan`); None: the pipeline is cut where its seconds balance
    cut: tuple[int, ...] | None = None


class BestSoFar:
    """The best plan a running `make_plan` has found, for a caller that may have to stop it early
    (a service shutting down keeps it with the job). The solver's thread offers each better
    solution; `result()`, from any thread, decodes and prices the last one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._formulation: Formulation | None = None
        self._microbatching: Microbatching | None = None
        self._hw: Hardware | None = None
        self._budget_bytes = 0.0
        self._started = self._built = 0.0
        self._solution: np.ndarray | None = None
        self._decode: Callable[[np.ndarray], np.ndarray] | None = None
        self._bound_ps = -math.inf

    def start(self, formulation: Formulation, hw: Hardware, budget_bytes: float, started: float, built: float,
              microbatching: Microbatching | None = None) -> None:
        with self._lock:
            self._formulation, self._hw, self._budget_bytes = formulation, hw, budget_bytes
            self._microbatching = microbatching
            self._started, self._built = started, built

    def offer(self, solution: np.ndarray, decode: Callable[[np.ndarray], np.ndarray] | None = None) -> None:
        """`decode` turns `solution` into one of the formulation's, only if `result()` is asked for."""
        with self._lock:
            self._solution, self._decode = np.array(solution, dtype=np.int64), decode

    def bound(self, bound_ps: float) -> None:
        with self._lock:
            self._bound_ps = max(self._bound_ps, bound_ps)

    def result(self) -> PlanResult | None:
        """The last offered plan, priced, its solver status "interrupted"; None before any."""
        with self._lock:
            formulation, hw, solution, microbatching = self._formulation, self._hw, self._solution, self._microbatching
            decode = self._decode
            bound_ps, budget_bytes, started, built = self._bound_ps, self._budget_bytes, self._started, self._built
        if formulation is None or hw is None or solution is None:
            return None
        if decode is not None:
            solution = decode(solution)
        plan, cost = priced_solution(formulation, hw, solution)
        lower = min(certified_lower(bound_ps), cost) if math.isfinite(bound_ps) else 0
        gap = (cost - lower) / cost if cost > 0 else 0.0
        solver = _solver_summary(formulation.problem, "interrupted", cost, lower, gap, built - started,
                                 time.perf_counter() - built, budget_bytes, first_feasible_s=None)
        return PlanResult(plan, estimate(plan, hw, microbatching), solver, PhaseTimes(), microbatching)


def make_plan(graph: Graph, mesh: Mesh, hw: Hardware, settings: SolveSettings = SolveSettings(),
              progress: Callable[[str, float, float, float], None] | None = None,
              phases: PhaseTimes | None = None, best_so_far: BestSoFar | None = None,
              prices: ReshardingPrices | None = None,
              memory: Callable[[Formulation], Formulation] | None = None, step_lists: bool = True,
              start: Plan | None = None, formulated_before: list[Formulation] | None = None) -> PlanResult:
    """`progress(phase, incumbent_ps, bound_ps, elapsed_s)` is called as the solver improves;
    `phases` (a new one if None) records the time and memory of formulating, solving and pricing;
    `best_so_far` is kept up to date with the best plan found while solving; `prices`: resharding
    prices already found on this mesh and hardware (`resharding_prices`), to be reused;
    `memory`: the formulation with its memory rows made otherwise (a pipeline's stages,
    `stage_memory`), its usage limit then the budget the solve holds to; `step_lists`: as
    `estimate`'s; `start`: a plan of the same graph (other pins allowed) the solve starts from and
    returns unless it finds better (where it fits the budget); `formulated_before`: what an earlier
    call on the same graph, mesh, hardware and settings formulated (as `memory` saw it, the shared
    formulation first), solved again under this call's budget without formulating anew."""
    phases = PhaseTimes() if phases is None else phases
    # numba compiles the solver's kernels once per install (about 25 s; then from its cache on
    # disk, once per process): a phase of its own, announced when long, not the plan's solve_s
    with phases.phase("kernel_compilation"):
        compile_kernels()
    started = time.perf_counter()
    budget_bytes = settings.memory_budget_bytes if settings.memory_budget_bytes is not None else hw.hbm_bytes
    with phases.phase("formulate"):
        microbatching = microbatch(graph, settings.microbatches) if settings.microbatches > 1 else None
        prices = prices if prices is not None else resharding_prices(mesh, hw)

        def formulated(delivered_nodes: bool) -> Formulation:
            found = formulate(microbatching.graph if microbatching else graph, mesh, hw,
                              memory_budget_bytes=budget_bytes, weights=settings.weights,
                              mesh_order=settings.mesh_order_splits, delivered_nodes=delivered_nodes, prices=prices)
            found = repeat_formulation(found, microbatching) if microbatching is not None else found
            return memory(found) if memory is not None else found

        if formulated_before:  # a budget enters a formulation as its usage limit only
            formulation, *rest = (_under_budget(f, budget_bytes) for f in formulated_before)
            per_use = rest[0] if rest else None
        else:
            formulation = formulated(True)
            shared = any(kind == "delivered" for kind, _ in formulation.nodes)
            per_use = formulated(False) if shared else None
    built = time.perf_counter()
    incumbent = None
    if best_so_far is not None:
        best_so_far.start(formulation, hw, budget_bytes, started, built, microbatching)
        incumbent = best_so_far.offer
        progress = _recording_bound(best_so_far, progress)
    with phases.phase("solve", reports_itself=True):
        started_from = _plan_hint(formulation, start)
        time_limit_s = settings.time_limit_s
        hint = started_from if started_from is not None else _whole_hint(formulation.problem, formulation.hint)
        if per_use is not None:
            # Shared reshardings' nodes slow the solver's search on deep graphs (a 24-layer 3-D step
            # ended 39% above its optimum where pricing each use alone reached 2%): the problem priced
            # use by use is solved first, and its plan, each value delivered as produced (the same
            # cost), starts the solve of the shared one
            first = solve(per_use.problem, time_limit_s=time_limit_s * PER_USE_SHARE, workers=settings.workers,
                          seed=settings.seed,
                          hint=_plan_hint(per_use, start, _whole_hint(per_use.problem, per_use.hint)),
                          progress=_without_bound(progress), deterministic=settings.deterministic,
                          gap_limit=settings.gap_limit, incumbent=_as_shared(per_use, formulation, best_so_far))
            if first.feasible:
                hint = np.array(formulation.solution(per_use.plan(first.solution), {}), dtype=np.int64)
            time_limit_s -= time_limit_s * PER_USE_SHARE
        result = solve(formulation.problem, time_limit_s=time_limit_s, workers=settings.workers,
                       seed=settings.seed, hint=hint, progress=progress, deterministic=settings.deterministic,
                       gap_limit=settings.gap_limit, incumbent=incumbent)
        for kept in (hint if per_use is not None else None, started_from):
            if kept is not None:
                result = _no_worse_than(formulation.problem, result, kept)
    if not result.feasible:
        raise InfeasibleError(explain_infeasible(formulation, budget_bytes))
    with phases.phase("pricing"):  # decoding the solution into a plan and pricing it
        plan, cost = priced_solution(formulation, hw, result.solution)
        report = estimate(plan, hw, microbatching, step_lists)
    # The certified bound and gap are over the additive price (compute + communication), the
    # objective the solver minimises; the report's overlapped step (`overlap`) stands beside it,
    # at most the additive one, and is neither minimised nor bounded, so the gap still says how
    # far this plan's price can be from the best plan's.
    status, gap = result.status, result.gap
    if cost != result.cost:
        gap = (cost - result.lower_bound) / cost if cost > 0 else 0.0
        status = "optimal" if status == "optimal" and cost <= result.lower_bound else "feasible"
    solver = _solver_summary(formulation.problem, status, cost, int(result.lower_bound), gap,
                             built - started, time.perf_counter() - built, budget_bytes,
                             first_feasible_s=result.stats.get("first_feasible_s"))
    return PlanResult(plan, report, solver, phases, microbatching)


def priced_solution(formulation: Formulation, hw: Hardware, solution: Sequence[int]) -> tuple[Plan, int]:
    """The plan of `solution` and its objective in picoseconds, with each value delivered as
    `estimate` delivers it (`delivered_shardings`): the objective is then what the report
    prices. The solver may have delivered a value otherwise; the bound stays a bound, as any
    choice of the delivered nodes is a solution of the same problem."""
    plan = formulation.plan(solution)
    delivered = delivered_shardings(plan, hw.collective_seconds)
    return plan, int(score(formulation.problem, formulation.solution(plan, delivered)).cost)


def _no_worse_than(problem: Problem, result: Result, start: np.ndarray) -> Result:
    """`result`, or the solution it started from where that fits and costs less."""
    kept = score(problem, start)
    if not kept.feasible or kept.forbidden or (result.feasible and kept.cost >= result.cost):
        return result
    gap = (kept.cost - result.lower_bound) / kept.cost if kept.cost > 0 else 0.0
    return replace(result, solution=tuple(int(s) for s in start), cost=kept.cost, gap=gap, feasible=True,
                   status="feasible")


def _as_shared(per_use: Formulation, formulation: Formulation, best_so_far: BestSoFar | None
               ) -> Callable[[np.ndarray], None] | None:
    """What offers the solve priced use by use makes to `best_so_far`: its solutions, turned (only
    when asked for) into the problem's with shared reshardings, each value delivered as produced
    (the same cost)."""
    if best_so_far is None:
        return None

    def shared(solution: np.ndarray) -> np.ndarray:
        return np.array(formulation.solution(per_use.plan(solution), {}), dtype=np.int64)

    return lambda solution: best_so_far.offer(solution, shared)


def _without_bound(progress: Callable[[str, float, float, float], None] | None
                   ) -> Callable[[str, float, float, float], None] | None:
    """`progress` for a solve whose bound is not the final problem's: incumbents only."""
    if progress is None:
        return None
    return lambda phase, cost, bound, elapsed_s: progress(phase, cost, -math.inf, elapsed_s)


def _recording_bound(best_so_far: BestSoFar, progress: Callable[[str, float, float, float], None] | None
                     ) -> Callable[[str, float, float, float], None]:
    def report(phase: str, cost: float, bound: float, elapsed_s: float) -> None:
        best_so_far.bound(bound)
        if progress is not None:
            progress(phase, cost, bound, elapsed_s)

    return report


def _solver_summary(problem: Problem, status: str, cost_ps: int, lower_bound_ps: int, gap: float,
                    formulate_s: float, solve_s: float, budget_bytes: float, *,
                    first_feasible_s: float | None) -> dict[str, Any]:
    """The plan document's `solver` section. `first_feasible_s`: seconds of solving until the first
    plan that fits (None when the solver does not say: an interrupted job)."""
    return {
        "status": status,
        "objective_ps": cost_ps,
        "objective_s": cost_ps / PICOSECONDS,
        "lower_bound_ps": lower_bound_ps,
        "gap": gap,
        "formulate_s": formulate_s,
        "solve_s": solve_s,
        "first_feasible_s": first_feasible_s,
        "problem": {"nodes": problem.num_nodes, "edges": problem.num_edges,
                    "strategies": int(np.sum(problem.num_strategies()))},
        "memory_budget_bytes": budget_bytes,
    }


def _under_budget(formulation: Formulation, budget_bytes: float) -> Formulation:
    return replace(formulation, problem=replace(formulation.problem, usage_limit=int(budget_bytes)))


def _plan_hint(formulation: Formulation, plan: Plan | None,
               otherwise: np.ndarray | None = None) -> np.ndarray | None:
    """`plan` as a solution of `formulation` (each value as produced), or `otherwise` where there is
    no plan or one of its choices is not among the formulation's (a pin of the plan's own graph
    may allow one this graph's options leave out)."""
    if plan is None:
        return otherwise
    try:
        return np.array(formulation.solution(plan, {}), dtype=np.int64)
    except (KeyError, ValueError):
        return otherwise


def _whole_hint(problem: Problem, hinted: list[int]) -> np.ndarray | None:
    """The graph's hints as a whole solution to start from (None without hints): a node without a
    hint takes its smallest-usage strategy, the choice that fits whenever anything does."""
    if not any(h >= 0 for h in hinted):
        return None
    return np.array([h if h >= 0 else int(np.lexsort((costs, usages))[0])
                     for h, costs, usages in zip(hinted, problem.node_costs, problem.node_usages)], dtype=np.int64)


def explain_infeasible(formulation: Formulation, budget_bytes: float) -> str:
    """Say which budget or pin makes every plan infeasible, with the numbers."""
    problem = formulation.problem
    steps = int(problem.intervals[:, 1].max()) if problem.num_nodes else 0
    least = np.zeros(max(steps, 1), dtype=np.int64)
    for i, usage in enumerate(problem.node_usages):
        start, end = problem.intervals[i]
        least[start:end] += int(usage.min())
    peak = int(np.argmax(least))
    order = topological_order(formulation.graph)
    at = order[peak].name if peak < len(order) else "end"
    pinned = [c.tensor for c in formulation.graph.constraints if c.required]
    if least[peak] <= budget_bytes:
        return (f"no plan within the memory budget {size(budget_bytes)} per device was found in the time limit, although "
                f"one may exist (the least possible peak is {size(int(least[peak]))}); raise the time limit or the budget")
    text = (f"the memory budget {size(budget_bytes)} per device is below {size(int(least[peak]))}, the least any plan "
            f"needs (at step {peak}, op {at!r}, with every value at its smallest sharding)")
    if pinned:
        text += f"; pinned tensors {pinned} keep their pinned shardings"
    return text
