"""Fairness: a small job submitted while every worker is busy with heavy ones starts at once in the
fast lane, by its size estimated at admission; heavy jobs never take the lane. Scheduling is checked
on the bookkeeping itself and through the runner with a stand-in for heavy solves (no real solve,
no timed assertion)."""

from __future__ import annotations

import json
import time
from typing import Callable

from service.config import Settings
from service.lanes import Lanes, job_size
from service.runner import Runner
from service.store import Store
from support.fake_solve import fake_solve
from support.service import MLP, settings_for


def test_a_small_job_takes_the_fast_lane_only_while_every_worker_is_busy():
    lanes = Lanes(workers=2, fast_workers=1)
    for job_id, small in (("heavy1", False), ("heavy2", False), ("heavy3", False), ("small1", True),
                          ("small2", True)):
        lanes.add(job_id, small)
    assert lanes.take() == [("heavy1", "main"), ("heavy2", "main"), ("small1", "fast")]
    assert lanes.take() == []  # heavy3 waits for a worker, small2 for the lane
    lanes.release("fast")
    assert lanes.take() == [("small2", "fast")]
    lanes.release("main")  # a freed worker goes to the oldest job, the heavy one
    assert lanes.take() == [("heavy3", "main")]


def test_a_small_job_uses_a_free_worker_before_the_fast_lane():
    lanes = Lanes(workers=1, fast_workers=1)
    lanes.add("small1", True)
    lanes.add("small2", True)
    lanes.add("small3", True)
    assert lanes.take() == [("small1", "main"), ("small2", "fast")]


def test_without_a_fast_lane_small_jobs_wait_behind_heavy_ones():
    lanes = Lanes(workers=1, fast_workers=0)
    lanes.add("heavy", False)
    lanes.add("small", True)
    assert lanes.take() == [("heavy", "main")]
    assert lanes.take() == []


def test_the_default_limit_puts_the_4_axis_mlp_in_the_heavy_lane_and_the_2_axis_one_in_the_fast(tmp_path):
    limit = Settings(db=tmp_path / "plans.sqlite3").fast_lane_max_size
    graph = json.loads(open("examples/mlp.json").read())
    assert job_size({"graph": graph, "mesh": "dp=2,tp=2"}) <= limit
    assert job_size({"graph": graph, "mesh": "a=2,b=2,c=2,d=2"}) > limit


def request(name: str, mesh: str, seed: int = 0) -> dict:
    return {"graph": MLP | {"name": name}, "mesh": mesh, "options": {"time_limit_s": 60, "seed": seed}}


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_small_jobs_finish_while_every_worker_is_busy_with_heavy_ones(tmp_path):
    settings = settings_for(tmp_path, workers=2, fast_lane_workers=1, fast_lane_max_size=1_000)
    assert job_size(request("heavy", "a=2,b=2,c=2,d=2")) > 1_000 >= job_size(request("small", "a=2"))
    store = Store(settings.db)
    runner = Runner(store, settings, solve=fake_solve)
    heavy = [runner.submit(f"heavy{i}", request("heavy", "a=2,b=2,c=2,d=2", seed=i)) for i in range(3)]
    try:
        wait_until(lambda: [store.get(j.id).status for j in heavy] == ["solving", "solving", "queued"],
                   "the first two heavy jobs never started")
        small = [runner.submit(f"small{i}", request(f"small{i}", "a=2")) for i in range(3)]
        wait_until(lambda: all(store.get(j.id).status == "done" for j in small),
                   "the small jobs waited on the heavy ones")
        assert [store.get(j.id).plan for j in small] == [{"graph": f"small{i}"} for i in range(3)]
        # the heavy jobs are still solving, and the third never took the fast lane
        assert [store.get(j.id).status for j in heavy] == ["solving", "solving", "queued"]
    finally:
        for job in heavy:
            runner.cancel(job.id)
        runner.shutdown()
        store.close()
