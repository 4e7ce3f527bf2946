"""Real widths without their weights: a Llama 3 8B layer built on the meta device is exported,
imported and planned; the plan made on the meta device runs the real model under torchrun on 2
and 4 gloo processes with the unsharded output (`examples/torchrun_llama.py`, as the README
tells users to run it)."""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

EXAMPLE = Path(__file__).parent.parent / "examples" / "torchrun_llama.py"
RUN_BUDGET_S = 240  # each torchrun: the processes start, import torch and run one forward


def example():
    spec = importlib.util.spec_from_file_location("torchrun_llama", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_llama_3_8b_layer_on_the_meta_device_plans_within_a_budget_below_its_weights(tmp_path):
    llama = example()
    model, tokens = llama.build("8b-layer", "meta")
    assert all(p.is_meta for p in model.parameters()) and tokens.is_meta
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert weight_bytes > 5e9  # the embedding and head alone are 2 x 128256 x 4096 f32 values
    out = tmp_path / "plan.json"
    assert llama.main(["plan", "--size", "8b-layer", "--mesh", "dp=2,tp=4", "--time-limit", "10",
                       "--memory-budget", "3.5e9", "-o", str(out)]) == 0
    document = json.loads(out.read_text())
    assert document["totals"]["peak_memory_bytes_per_device"] <= 3.5e9
    assert document["totals"]["parameter_bytes_per_device"] < weight_bytes / 2
    sharded = {name for name, sharding in document["tensors"].items() if any(sharding["split_axes"])}
    assert {"lm_head.weight", "model.embed_tokens.weight"} <= sharded


# the tiny model's weights are about 360 KB: a budget under them makes the plan shard
@pytest.mark.parametrize("mesh, processes, budget", [("dp=2", 2, "300000"), ("dp=2,tp=2", 4, "150000")])
def test_a_plan_made_on_the_meta_device_runs_the_real_model_under_torchrun(tmp_path, mesh, processes, budget):
    plan = tmp_path / "plan.json"
    assert example().main(["plan", "--size", "tiny", "--mesh", mesh, "--time-limit", "10",
                           "--memory-budget", budget, "-o", str(plan)]) == 0
    assert any(any(s["split_axes"]) for name, s in json.loads(plan.read_text())["tensors"].items()
               if name.endswith("proj.weight"))
    reports = tmp_path / "reports"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(processes),
               "--master-port", str(free_port()), str(EXAMPLE), "run", "--size", "tiny", "--plan", str(plan),
               "--check", "--report-dir", str(reports)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=RUN_BUDGET_S)
    assert done.returncode == 0, done.stderr[-3000:]
    found = [json.loads((reports / f"rank{rank}.json").read_text()) for rank in range(processes)]
    assert [(r["rank"], r["world"]) for r in found] == [(rank, processes) for rank in range(processes)]
    assert all(r["max_error"] < 1e-5 and r["shape"] == [4, 16, 128] for r in found)
