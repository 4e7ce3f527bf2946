"""`/v1/plans`: submit a plan request, follow its job, fetch the plan and its IR, cancel it."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Literal

from fastapi import APIRouter, Depends, Query, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import PlainTextResponse

from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.planning.plan import plan_from_json
from service import deps
from service.config import Settings
from service.errors import Conflict, NotFound
from service.inputs import bind_topology, canonical_plan_request, request_key
from service.ir import emit_ir, ir_arguments
from service.routes import INPUT_ERRORS, errors
from service.runner import Runner
from service.schemas import Dialect, PlanJob, PlanRequest, Stage
from service.store import Job, Store

router = APIRouter(prefix="/v1/plans", tags=["plans"], responses=errors(422))


def _time(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="milliseconds")


def job_out(job: Job, store: Store) -> PlanJob:
    options = job.request["options"]
    ir = {}
    if job.status == "done":
        for stage in options["emit"]:
            text = store.get_ir(job.id, stage, options["dialect"], ir_arguments(stage, "local"))
            if text is not None:
                ir[stage] = text
    progress = job.progress
    if job.status == "queued":
        progress = {"phase": "queued", "queue_position": store.queue_position(job.id)}
    return PlanJob(id=job.id, status=job.status, progress=progress, plan=job.plan, ir=ir, error=job.error,
                   created_at=_time(job.created_at), updated_at=_time(job.updated_at))


def _job(store: Store, plan_id: str) -> Job:
    job = store.get(plan_id)
    if job is None:
        raise NotFound(f"no plan with id {plan_id!r}")
    return job


@router.post("", response_model=PlanJob, status_code=202,
             responses={200: {"model": PlanJob, "description": "the plan is done (or failed) within `wait`"},
                        202: {"description": "accepted; follow `Location`"}, **INPUT_ERRORS})
async def submit_plan(body: PlanRequest, response: Response,
                      wait: float = Query(0.0, ge=0, le=3600, description="seconds to wait for the outcome before "
                                                                          "answering 202 (capped by the server)"),
                      store: Store = Depends(deps.store), runner: Runner = Depends(deps.runner),
                      settings: Settings = Depends(deps.settings)) -> PlanJob:
    """Plan a graph on a mesh. Identical requests share one job (and its stored plan)."""
    canonical = await run_in_threadpool(canonical_plan_request, body.model_dump(mode="json"), settings)
    job = await run_in_threadpool(runner.submit, request_key(canonical), canonical)
    await runner.wait(job.id, min(wait, settings.max_wait_s))
    job = _job(store, job.id)
    response.status_code = 200 if job.final else 202
    response.headers["Location"] = f"{router.prefix}/{job.id}"
    return job_out(job, store)


@router.get("/{plan_id}", response_model=PlanJob, responses=errors(404))
def get_plan(plan_id: str, store: Store = Depends(deps.store)) -> PlanJob:
    """The job's status and progress; the plan document once done, the error once failed."""
    return job_out(_job(store, plan_id), store)


@router.get("/{plan_id}/ir", response_class=PlainTextResponse,
            responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "MLIR text"},
                       **errors(404, 409, 422, text_route=True)})
def get_ir(plan_id: str, stage: Stage = "annotated", dialect: Dialect | None = None,
           arguments: Literal["local", "global"] = "local", store: Store = Depends(deps.store)) -> PlainTextResponse:
    """The plan as MLIR: `annotated` (a sharding on every value) or `partitioned` (per-device
    program with collectives; `arguments` local shards or global values). `dialect` defaults to
    the one the plan was requested with."""
    job = _job(store, plan_id)
    if job.status != "done" or job.plan is None:
        raise Conflict(f"plan {plan_id} is {job.status}; its IR exists once it is done")
    dialect = dialect or job.request["options"]["dialect"]
    arguments = ir_arguments(stage, arguments)
    text = store.get_ir(plan_id, stage, dialect, arguments)
    if text is None:
        request = job.request
        mesh = Mesh.parse(request["mesh"])
        plan = plan_from_json(job.plan, graph_from_json(request["graph"], mesh), mesh)
        hardware = bind_topology(request["topology"], request["topology_options"], mesh)
        text = emit_ir(plan, hardware, stage, dialect, arguments or "local",
                       request["options"].get("collective_optimizations", True))
        store.put_ir(plan_id, stage, dialect, arguments, text)
    return PlainTextResponse(text)


@router.delete("/{plan_id}", response_model=PlanJob,
               responses=errors(404, 409))
def cancel_plan(plan_id: str, store: Store = Depends(deps.store), runner: Runner = Depends(deps.runner)) -> PlanJob:
    """Cancel a queued or solving plan (its worker process is stopped). Cancelling twice is harmless."""
    job = _job(store, plan_id)
    if not runner.cancel(plan_id):
        job = _job(store, plan_id)
        if job.status != "cancelled":
            raise Conflict(f"plan {plan_id} is already {job.status}; only a queued or solving plan can be cancelled")
    return job_out(_job(store, plan_id), store)
