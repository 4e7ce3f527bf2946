"""`/v1/estimate`: what a caller's plan costs (compute, communication per axis, memory), no solving."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from autoshard.errors import InputError, Problem
from autoshard.planning.microbatches import microbatch, stated_microbatches
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
    hardware = bind_topology(body.topology, body.topology_options.model_dump(exclude_none=True), mesh)
    try:
        microbatching = microbatch(graph, stated_microbatches(body.plan, body.microbatches))
    except InputError as error:
        # the request's own field, the plan's, or the graph's batch dims
        where = {"microbatches": "/microbatches", "/microbatches": "/plan/microbatches"}
        raise InputError([Problem(where.get(p.where, "/graph" + p.where), p.message) for p in error.problems]) from None
    try:
        plan = read_plan(body.plan, microbatching.graph, mesh)  # as the CLI's estimate, emit and simulate do
    except InputError as error:
        raise under("/plan", error) from None
    return Estimate(**estimate(plan, hardware, microbatching if microbatching.count > 1 else None).to_json())
