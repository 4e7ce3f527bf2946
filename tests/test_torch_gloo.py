"""Smoke test on real processes: two gloo ranks over loopback run a plan read back from its
plan.json document; each rank's output equals the unsharded module's, with the plan's collectives.

(gloo has no all_to_all: DTensor would substitute an all_gather; this plan has none.)"""

from __future__ import annotations

import json
import socket

import pytest

torch = pytest.importorskip("torch")

from support.dtensor import planned_collectives, sharded_plan  # noqa: E402
from support.gloo_worker import run_rank  # noqa: E402
from support.torch_models import examples, exported  # noqa: E402

from autoshard.delivery.document import plan_document  # noqa: E402
from autoshard.frontends.torch import import_program  # noqa: E402

# CommDebugMode's names -> our step kinds
NAMES = {"all_reduce": "all_reduce", "all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_gloo_processes_run_the_plan(tmp_path):
    module, args = examples()["mlp"]
    result = sharded_plan(import_program(exported(module, args)).document, "tp=2", memory_s_per_byte=1e-9)
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(plan_document(result, "dgx-h100")))
    torch.multiprocessing.spawn(run_rank, args=(2, free_port(), str(plan_path), str(tmp_path)), nprocs=2, join=True)
    planned: dict[str, int] = {}
    for c in planned_collectives(result):
        planned[c.kind] = planned.get(c.kind, 0) + 1
    assert planned
    for rank in range(2):
        report = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert report["max_error"] < 1e-5
        assert {NAMES[k]: n for k, n in report["collectives"].items()} == planned
