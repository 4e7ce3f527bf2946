"""`/v1/estimate`: what a caller's plan costs (compute, communication per axis, memory), no solving."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from autoshard.errors import InputError, Problem
from autoshard.graph.recompute import stated_recompute, with_recomputation
from autoshard.planning.microbatches import microbatch, stated_microbatches
from autoshard.planning.pipeline_cut import read_cut
from autoshard.planning.pipeline_plan import estimate_cut, pipeline_mesh
from autoshard.planning.plan_contract import read_plan
from autoshard.planning.report import estimate
from service import deps
from service.config import Settings
from service.inputs import bind_topology, parse_graph, parse_mesh, under
from service.routes import INPUT_ERRORS
from service.schemas import Estimate, EstimateRequest

router = APIRouter(prefix="/v1/estimate", tags=["estimate"])


@router.post("", response_model=Estimate, responses=INPUT_ERRORS)
def estimate_plan(body: EstimateRequest, settings: Settings = Depends(deps.settings)) -> Estimate:
    """Per-op compute, every resharding with its collectives, per-axis traffic and per-device peak memory."""
    mesh = parse_mesh(body.model_dump(mode="json")["mesh"], settings.max_devices)
    graph = parse_graph(body.graph, mesh, settings)
    placed = body.topology_options.model_dump(exclude_none=True)
    hardware = bind_topology(body.topology, placed, mesh)  # the topology's problems before the plan's
    try:  # the graph the plan was made for, with the recomputation it records
        graph = with_recomputation(graph, stated_recompute(body.plan), mesh)
    except InputError as error:
        raise under("/plan", error) from None
    try:
        microbatching = microbatch(graph, stated_microbatches(body.plan, body.microbatches))
    except InputError as error:
        # the request's own field, the plan's, or the graph's batch dims
        where = {"microbatches": "/microbatches", "/microbatches": "/plan/microbatches"}
        raise InputError([Problem(where.get(p.where, "/graph" + p.where), p.message) for p in error.problems]) from None
    try:
        plan = read_plan(body.plan, microbatching.graph, mesh)  # as the CLI's estimate, emit and simulate do
        cut = read_cut(body.plan, microbatching.graph) if "pipeline" in body.plan else None
    except InputError as error:
        raise under("/plan", error) from None
    if cut is not None:  # a pipelined plan's machine is its stages times the request's mesh, as it was made on
        hardware = bind_topology(body.topology, placed, pipeline_mesh(mesh, cut.orders.stages))
    microbatched = microbatching if microbatching.count > 1 else None
    report = estimate(plan, hardware, microbatched)
    pipelined = estimate_cut(plan, report, microbatched, mesh, hardware, cut).to_json() if cut is not None else None
    return Estimate(**report.to_json(), pipeline=pipelined)
