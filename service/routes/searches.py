"""`/v1/searches`: which mesh, laid out how, for a graph on a number of devices; follow the job,
fetch the ranking and the winning plan, cancel it."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone
from typing import Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field

import cost_models
from autoshard.errors import InputError, Problem
from autoshard.planning.formulation import Weights as ObjectiveWeights
from autoshard.planning.make_plan import MAX_MEMORY_BUDGET_BYTES, MAX_SEED, SolveSettings
from autoshard.search.candidates import MAX_AXES, enumerate_candidates, fixed_axes_problems
from autoshard.search.fanout import RAY_MISSING, ray_installed
from autoshard.search.run import SearchOptions
from service.errors import Conflict, NotFound
from service.inputs import check_graph_size, parse_graph
from service.routes import INPUT_ERRORS, errors
from service.schemas import ErrorOut, Weights
from service.searches import Searches, SearchJob, search_problems

router = APIRouter(prefix="/v1/searches", tags=["searches"], responses=errors(422))


class _Wire(BaseModel):
    # strict: `true` is not a number nor "yes" a boolean
    model_config = ConfigDict(extra="forbid", strict=True)


class SearchSettings(_Wire):
    max_axes: int = Field(MAX_AXES, ge=1, le=MAX_AXES, description="most mesh axes a candidate has")
    fix: dict[str, int] = Field(default_factory=dict, description='axes every candidate has, e.g. {"tp": 8}; the '
                                                                  "other axes are named a0, a1, ... by mesh position")
    time_limit_s: float | None = Field(None, gt=0, description="each solve's time limit (default and cap: server "
                                                               "settings)")
    time_budget_s: float | None = Field(None, gt=0, description="the whole search's wall time (default and cap: the "
                                                                "server's longest solve time limit)")
    gap_limit: float = Field(1e-4, ge=0, lt=1)
    memory_budget_bytes: float | None = Field(None, gt=0, le=MAX_MEMORY_BUDGET_BYTES,
                                              description="per-device memory limit (default: the chip's HBM)")
    weights: Weights = Field(default_factory=Weights)
    seed: int = Field(0, ge=0, le=MAX_SEED)
    deterministic: bool = Field(False, description="fixed solver work instead of the clock: the same request "
                                                   "gives the same ranking")
    mesh_order_splits: bool = Field(False, description="a dim split over several mesh axes takes them in mesh "
                                                       "order only (as `autoshard search --mesh-order-splits`)")
    ray: bool = Field(False, description="run the solves on Ray (a local instance, or the one the server runs in); "
                                         "needs the server's `ray` extra")


class SearchRequest(_Wire):
    graph: dict[str, Any] = Field(description="a graph document, format autoshard.graph/v1")
    devices: int = Field(ge=2, le=2 ** 20, description="number of GPUs or TPU chips")
    topology: str = Field("dgx-h100", description="a shipped profile name (GET /v1/topologies)")
    options: SearchSettings = Field(default_factory=SearchSettings)


class SearchJobOut(BaseModel):
    id: str
    status: str = Field(description="queued, searching, done, failed or cancelled")
    progress: dict[str, Any] = Field(default_factory=dict, description="phase (bound or solve), candidates done of "
                                                                       "total, the last one finished")
    ranking: dict[str, Any] | None = Field(None, description="the ranking (autoshard.ranking/v1) once done")
    plan: dict[str, Any] | None = Field(None, description="the winner's plan (autoshard.plan/v1) once done")
    error: ErrorOut | None = None
    created_at: str
    updated_at: str


def _time(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="milliseconds")


def job_out(job: SearchJob) -> SearchJobOut:
    return SearchJobOut(id=job.id, status=job.status, progress=job.progress, ranking=job.ranking, plan=job.plan,
                        error=ErrorOut(**job.error) if job.error else None, created_at=_time(job.created_at),
                        updated_at=_time(job.updated_at))


def searches_of(request: Request) -> Searches:
    return request.app.state.searches


def checked_options(body: SearchRequest, request: Request) -> SearchOptions:
    """Every problem of the request, as a pointer into it, before the search is queued."""
    settings = request.app.state.settings
    options = body.options
    problems = []
    if body.devices > settings.max_devices:
        problems.append(Problem("/devices", f"{body.devices} devices; this service accepts at most "
                                            f"{settings.max_devices}"))
    if body.topology not in cost_models.list_profiles():
        problems.append(Problem("/topology", f"unknown topology {body.topology!r}; expected one of "
                                             f"{cost_models.list_profiles()}"))
    time_limit_s = options.time_limit_s if options.time_limit_s is not None else settings.default_time_limit_s
    if time_limit_s > settings.max_time_limit_s:
        problems.append(Problem("/options/time_limit_s", f"at most {settings.max_time_limit_s:g} s on this service, "
                                                         f"got {time_limit_s:g}"))
    budget_s = options.time_budget_s if options.time_budget_s is not None else settings.max_time_limit_s
    if budget_s > settings.max_time_limit_s:
        problems.append(Problem("/options/time_budget_s", f"at most {settings.max_time_limit_s:g} s on this service, "
                                                          f"got {budget_s:g}"))
    problems += fixed_axes_problems(options.fix, lambda name: f"/options/fix/{name}")
    if options.ray and not ray_installed():
        problems.append(Problem("/options/ray", RAY_MISSING))
    if problems:
        raise InputError(problems)
    weights = options.weights
    settings_ = SolveSettings(time_limit_s=time_limit_s, gap_limit=options.gap_limit, workers=1, seed=options.seed,
                              memory_budget_bytes=options.memory_budget_bytes,
                              weights=ObjectiveWeights(weights.time, weights.comm_s_per_byte,
                                                       weights.memory_s_per_byte),
                              deterministic=options.deterministic, mesh_order_splits=options.mesh_order_splits)
    check_graph_size(body.graph, settings)
    parse_graph(body.graph, None, settings)  # its constraints are checked per candidate mesh
    try:
        searched = SearchOptions(devices=body.devices, topology=body.topology, settings=settings_,
                                 max_axes=options.max_axes, fixed=dict(options.fix), jobs=settings.workers,
                                 ray="auto" if options.ray else None, time_budget_s=budget_s)
        enumerate_candidates(body.topology, body.devices, max_axes=options.max_axes, fixed=searched.fixed)
    except InputError as error:
        raise search_problems(error) from None
    return searched


@router.post("", response_model=SearchJobOut, status_code=202,
             responses={200: {"model": SearchJobOut, "description": "the search ended within `wait`"},
                        202: {"description": "accepted; follow `Location`"}, **INPUT_ERRORS})
async def submit_search(body: SearchRequest, request: Request, response: Response,
                        wait: float = Query(0.0, ge=0, le=3600, description="seconds to wait for the outcome "
                                                                            "before answering 202 (capped by the "
                                                                            "server)")) -> SearchJobOut:
    """Search the meshes and placements of `devices` devices of `topology` for the graph: every
    candidate bounded, the promising ones solved, all ranked."""
    options = await run_in_threadpool(checked_options, body, request)
    searches = searches_of(request)
    job = searches.submit(body.graph, options)
    deadline = min(wait, request.app.state.settings.max_wait_s)
    waited = 0.0
    while waited < deadline and not job.final:
        await asyncio.sleep(0.1)
        waited += 0.1
    response.status_code = 200 if job.final else 202
    response.headers["Location"] = f"{router.prefix}/{job.id}"
    return job_out(job)


def _job(request: Request, search_id: str) -> SearchJob:
    job = searches_of(request).get(search_id)
    if job is None:
        raise NotFound(f"no search with id {search_id!r}")
    return job


@router.get("/{search_id}", response_model=SearchJobOut, responses=errors(404))
def get_search(search_id: str, request: Request) -> SearchJobOut:
    """The search's status and progress; the ranking and the winning plan once done."""
    return job_out(_job(request, search_id))


@router.delete("/{search_id}", response_model=SearchJobOut, responses=errors(404, 409))
def cancel_search(search_id: str, request: Request) -> SearchJobOut:
    """Stop a queued or running search (its workers are stopped)."""
    job = _job(request, search_id)
    if job.final:
        raise Conflict(f"search {search_id!r} is already {job.status}")
    searches_of(request).cancel(job)
    return job_out(job)
