"""The two kinds of task a search fans out, each a pure function of its inputs so that it runs
alike in a local worker process or a Ray worker: bounding one candidate and solving one candidate.

Bounding a candidate formulates it, which is mostly pricing reshardings (all of it on meshes of
many axes: a 4-axis candidate of a 2-layer GPT asks 425k pairs); the bound hands the prices it
found back (`"prices"`, `KnownPrices`), and the candidate's solve starts from them instead of
pricing every pair again in another worker. Prices are a function of the mesh and hardware
alone, so the solve's formulation is the same either way."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

from autoshard.errors import InfeasibleError, InputError
from autoshard.graph.schema import load_graph
from autoshard.planning.formulation import KnownPrices, formulate, resharding_prices
from autoshard.planning.hardware import bind_hardware
from autoshard.planning.make_plan import SolveSettings, make_plan
from autoshard.planning.plan import plan_to_json
from autoshard.search.bound import least_peak_bytes, objective_lower_bound_ps
from autoshard.search.candidates import Candidate
from autoshard.search.sample_tasks import SampleTask, solve_sample_task
from autoshard.search.stage_tasks import StageTask, solve_stage_task


@dataclass(frozen=True)
class SearchInputs:
    """What every task of one search shares (sent to each worker once)."""

    graph_document: dict[str, Any]
    topology: str
    settings: SolveSettings


def bind_candidate(inputs: SearchInputs, candidate: Candidate):
    return bind_hardware(inputs.topology, candidate.mesh, nodes=candidate.nodes, slice_shape=candidate.slice_shape,
                         mapping=candidate.mapping_json)


def budget_bytes(inputs: SearchInputs, hardware) -> float:
    budget = inputs.settings.memory_budget_bytes
    return budget if budget is not None else hardware.hbm_bytes


def bound_candidate(inputs: SearchInputs, candidate: Candidate) -> dict[str, Any]:
    """The candidate's certified objective bound and least peak memory, and the resharding prices
    its formulation found (`"prices"`, for its solve)."""
    started = time.perf_counter()
    mesh = candidate.mesh
    try:
        graph = load_graph(inputs.graph_document, mesh)
    except InputError as error:  # a constraint of the graph names an axis this mesh lacks, or does not fit it
        return {"infeasible": f"the graph's constraints do not fit this mesh: {error}",
                "bound_s": time.perf_counter() - started}
    hardware = bind_candidate(inputs, candidate)
    prices = resharding_prices(mesh, hardware)
    try:
        formulation = formulate(graph, mesh, hardware, memory_budget_bytes=budget_bytes(inputs, hardware),
                                weights=inputs.settings.weights, mesh_order=inputs.settings.mesh_order_splits,
                                prices=prices)
    except InfeasibleError as error:  # a pin no option of this mesh produces
        return {"infeasible": str(error), "bound_s": time.perf_counter() - started}
    return {"bound_ps": objective_lower_bound_ps(formulation.problem),
            "least_peak_bytes": least_peak_bytes(formulation.problem),
            "memory_budget_bytes": budget_bytes(inputs, hardware),
            "bound_s": time.perf_counter() - started,
            "prices": prices.known()}


def solve_candidate(inputs: SearchInputs, candidate: Candidate, time_limit_s: float,
                    known: KnownPrices | None = None) -> dict[str, Any]:
    """`make_plan` on the candidate's mesh and placement: its ranking row and the plan as JSON
    (or the reason it has none). `known`: the prices its bound found."""
    started = time.perf_counter()
    mesh = candidate.mesh
    graph = load_graph(inputs.graph_document, mesh)
    hardware = bind_candidate(inputs, candidate)
    settings = dataclasses.replace(inputs.settings, time_limit_s=time_limit_s)
    prices = resharding_prices(mesh, hardware)
    if known is not None:
        prices.remember(known)
    try:
        result = make_plan(graph, mesh, hardware, settings, prices=prices)
    except InfeasibleError as error:
        return {"infeasible": str(error), "wall_s": time.perf_counter() - started}
    report, solver = result.report, result.solver
    return {
        "objective_ps": solver["objective_ps"],
        "lower_bound_ps": solver["lower_bound_ps"],
        "gap": solver["gap"],
        "status": solver["status"],
        "step_s": report.step_s,
        "compute_s": report.compute_s,
        "communication_s": report.communication_s,
        "overlapped_step_s": report.overlap.step_s,
        "communication_s_per_axis": dict(sorted(report.seconds_per_axis.items())),
        "communication_bytes_per_axis": dict(sorted(report.bytes_per_axis.items())),
        "peak_memory_bytes": report.peak_memory_bytes,
        "solve_s": solver["formulate_s"] + solver["solve_s"],
        "wall_s": time.perf_counter() - started,
        "solver": solver,
        "plan": plan_to_json(result.plan),
    }


def run_task(inputs: SearchInputs, kind: str, candidate: Candidate | StageTask | SampleTask, time_limit_s: float,
             known: KnownPrices | None = None) -> dict[str, Any]:
    if isinstance(candidate, StageTask):  # kind "stage": search --pipeline auto's intra-stage plan
        return solve_stage_task(inputs, candidate, time_limit_s)
    if isinstance(candidate, SampleTask):  # kind "sample": search --by-layer's layer sample
        return solve_sample_task(inputs, candidate, time_limit_s)
    if kind == "bound":
        return bound_candidate(inputs, candidate)
    return solve_candidate(inputs, candidate, time_limit_s, known)
