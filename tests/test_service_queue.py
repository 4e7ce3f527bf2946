"""The service's fairness and shutdowns: solve workers default to the machine's cores, a queued
job says where it stands in the queue, and a solve stopped by a shutdown keeps its best plan."""

from __future__ import annotations

import os
import time

from fastapi.testclient import TestClient

from autoshard.client import Client
from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.planning.hardware import bind_hardware
from autoshard.planning.plan import plan_from_json
from autoshard.planning.report import estimate
from autoshard.sim.program import verify_plan
from service.app import create_app
from service.config import Settings
from support.service import LONG_SOLVE, deep_mlp, settings_for


def test_solve_workers_default_to_the_cores_this_process_may_use(tmp_path):
    assert Settings(db=tmp_path / "plans.sqlite3").workers == len(os.sched_getaffinity(0))


def test_a_queued_job_shows_its_place_in_the_queue(tmp_path):
    settings = settings_for(tmp_path, workers=1, max_ops=64, max_tensors=128, max_body_bytes=200_000)
    graph = deep_mlp(24)
    with TestClient(create_app(settings)) as http:
        client = Client(http=http)
        jobs = [client.submit(graph, "a=2,b=2,c=2", options={"time_limit_s": 60, "seed": seed} | LONG_SOLVE) for seed in range(3)]
        deadline = time.monotonic() + 60
        while client.get(jobs[0].id).status != "solving":
            assert time.monotonic() < deadline, "the first job never started"
            time.sleep(0.05)
        second, third = client.get(jobs[1].id), client.get(jobs[2].id)
        assert (second.status, third.status) == ("queued", "queued")
        assert second.progress == {"phase": "queued", "queue_position": 1}
        assert third.progress == {"phase": "queued", "queue_position": 2}
        client.cancel(jobs[1].id)  # the job behind a cancelled one moves up
        assert client.get(jobs[2].id).progress["queue_position"] == 1
        assert "queue_position" not in client.get(jobs[0].id).progress
        for job in jobs:
            client.cancel(job.id)


def test_a_solve_stopped_by_a_shutdown_keeps_its_best_plan_marked_interrupted(tmp_path):
    settings = settings_for(tmp_path, workers=1, max_ops=64, max_tensors=128, max_body_bytes=200_000)
    graph = deep_mlp(24)
    with TestClient(create_app(settings)) as http:
        client = Client(http=http)
        job = client.submit(graph, "a=2,b=2,c=2", options={"time_limit_s": 60} | LONG_SOLVE)
        deadline = time.monotonic() + 120
        while client.get(job.id).progress.get("objective") is None:
            assert time.monotonic() < deadline, "the solver never reported a plan"
            time.sleep(0.05)
        reported = client.get(job.id).progress["objective"]
    # leaving the block shut the service down as a SIGTERM does
    with TestClient(create_app(settings)) as http:
        kept = Client(http=http).get(job.id)
    assert kept.status == "interrupted" and kept.error["kind"] == "interrupted"
    assert "best found" in kept.error["message"]
    document = kept.plan
    assert document["solver"]["status"] == "interrupted"
    # the hand-over came after the last progress report: the plan is at least as good
    assert 0 < document["solver"]["objective_ps"] <= reported
    assert document["solver"]["lower_bound_ps"] <= document["solver"]["objective_ps"]
    mesh = Mesh.parse("a=2,b=2,c=2")
    plan = plan_from_json(document, graph_from_json(graph, mesh), mesh)
    hw = bind_hardware("dgx-h100", mesh)
    assert estimate(plan, hw).peak_memory_bytes <= LONG_SOLVE["memory_budget_bytes"]
    assert estimate(plan, hw).to_json()["totals"] == document["totals"]
    verdict = verify_plan(plan, hw.collective_seconds)
    assert verdict.passed, verdict.summary()
