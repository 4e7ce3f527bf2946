"""`autoshard serve` as a real uvicorn process on 127.0.0.1: plans through the client, the store
across a restart and a crash, cancellation of a running solve, a property-based run of the
served OpenAPI spec. Every server is stopped when its block ends."""

from __future__ import annotations

import time
from pathlib import Path

import hypothesis
import pytest
import schemathesis
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from autoshard.client import Client, LocalService, PlanJob
from support.service import LONG_SOLVE, deep_mlp

MLP = {
    "format": "autoshard.graph/v1", "name": "mlp",
    "tensors": {"x": {"shape": [8, 16], "dtype": "f32", "role": "input"},
                "w1": {"shape": [16, 32], "dtype": "f32", "role": "parameter"},
                "h": {"shape": [8, 32], "dtype": "f32"}},
    "ops": [{"name": "fc1", "kind": "matmul", "inputs": ["x", "w1"], "outputs": ["h"]}],
}
POLLS = 600  # x 0.05 s: how long a job may take to reach a state


def server(db: Path, log: Path, env: dict[str, str] | None = None) -> LocalService:
    """`autoshard serve` with one worker; leaving its block stops it (SIGTERM)."""
    return LocalService(db, log=log, env={"AUTOSHARD_MAX_TIME_LIMIT_S": "600"} | (env or {}))


def reach(client: Client, plan_id: str, status: str) -> PlanJob:
    for _ in range(POLLS):
        job = client.get(plan_id)
        if job.status == status:
            return job
        assert not job.final, job
        time.sleep(0.05)
    pytest.fail(f"plan {plan_id} never became {status}")


def test_a_plan_outlives_the_server_that_made_it(tmp_path):
    db, log = tmp_path / "plans.sqlite3", tmp_path / "server.log"
    with server(db, log) as client:
        submitted = client.submit(MLP, "dp=2,tp=2", "dgx-h100", options={"time_limit_s": 2})
        job = client.poll(submitted.id, timeout_s=60)
        assert job.status == "done", job.error
        assert job.plan["totals"]["peak_memory_bytes_per_device"] > 0
    with server(db, log) as client:
        assert client.get(job.id).plan == job.plan
        # the identical request is answered from the store, done, without solving again
        again = client.submit(MLP, "dp=2,tp=2", "dgx-h100", options={"time_limit_s": 2})
        assert (again.id, again.status, again.plan) == (job.id, "done", job.plan)


def test_cancel_frees_the_worker_and_a_crash_leaves_the_solve_interrupted(tmp_path):
    db, log = tmp_path / "plans.sqlite3", tmp_path / "server.log"
    graph = deep_mlp(24)
    crashing = server(db, log)
    with crashing as client:
        first = client.submit(graph, "a=2,b=2,c=2", options={"time_limit_s": 300} | LONG_SOLVE)
        reach(client, first.id, "solving")
        assert client.cancel(first.id).status == "cancelled"
        assert client.cancel(first.id).status == "cancelled"  # cancelling twice is harmless
        # one worker: the next solve starts only because the cancelled one was stopped
        second = client.submit(graph, "a=2,b=2,c=2", options={"time_limit_s": 300, "seed": 1} | LONG_SOLVE)
        reach(client, second.id, "solving")
        crashing.stop(crash=True)
    with server(db, log) as client:
        assert client.get(first.id).status == "cancelled"
        interrupted = client.get(second.id)
        # a killed service could hand nothing over
        assert interrupted.status == "interrupted" and interrupted.plan is None
        assert interrupted.error["kind"] == "interrupted"


def test_a_sigterm_keeps_the_best_plan_of_the_running_solve(tmp_path):
    db, log = tmp_path / "plans.sqlite3", tmp_path / "server.log"
    with server(db, log) as client:
        job = client.submit(deep_mlp(24), "a=2,b=2,c=2", options={"time_limit_s": 300} | LONG_SOLVE)
        deadline = time.monotonic() + 120
        while client.get(job.id).progress.get("objective") is None:
            assert time.monotonic() < deadline, "the solver never reported a plan"
            time.sleep(0.05)
    with server(db, log) as client:
        kept = client.get(job.id)
    assert kept.status == "interrupted" and kept.plan["solver"]["status"] == "interrupted"
    assert kept.plan["totals"]["peak_memory_bytes_per_device"] <= LONG_SOLVE["memory_budget_bytes"]


@pytest.fixture
def served_schema(tmp_path):
    """The served OpenAPI spec; a short wait cap and time limits keep generated requests quick."""
    path = tmp_path
    env = {"AUTOSHARD_MAX_WAIT_S": "0.2", "AUTOSHARD_MAX_TIME_LIMIT_S": "2", "AUTOSHARD_DEFAULT_TIME_LIMIT_S": "1"}
    with server(path / "plans.sqlite3", path / "server.log", env=env) as client:
        yield schemathesis.openapi.from_url(f"{client.http.base_url}/openapi.json")


CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def test_no_generated_request_makes_the_service_fail(served_schema):
    """Valid and invalid requests for every operation (at most 2 x 15 each, about 150 in all): no
    5xx, and every status, content type and body as the spec documents."""
    for result in served_schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
            @hypothesis.settings(max_examples=15, deadline=None, derandomize=True, database=None,
                                 suppress_health_check=list(hypothesis.HealthCheck))
            def check(case):
                case.call_and_validate(checks=CHECKS, timeout=30)

            try:
                check()
            except hypothesis.errors.Unsatisfiable:
                # some operations have no invalid request (no body, any string is an id)
                assert mode is GenerationMode.NEGATIVE, operation.label
