"""The service's fairness settings: solve workers default to the machine's cores, and a queued
job says where it stands in the queue."""

from __future__ import annotations

import os
import time

from fastapi.testclient import TestClient

from autoshard.client import Client
from service.app import create_app
from service.config import Settings
from support.service import deep_mlp, settings_for


def test_solve_workers_default_to_the_cores_this_process_may_use(tmp_path):
    assert Settings(db=tmp_path / "plans.sqlite3").workers == len(os.sched_getaffinity(0))


def test_a_queued_job_shows_its_place_in_the_queue(tmp_path):
    settings = settings_for(tmp_path, workers=1, max_ops=64, max_tensors=128, max_body_bytes=200_000)
    graph = deep_mlp(24)
    with TestClient(create_app(settings)) as http:
        client = Client(http=http)
        jobs = [client.submit(graph, "a=2,b=2,c=2", options={"time_limit_s": 60, "seed": seed}) for seed in range(3)]
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
