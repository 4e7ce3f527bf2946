"""Tokens per second per device and MFU beside each search result: the numerator is the model's
forward and backward work (recomputation and the optimizer left out), the peak the chip's for the
dtype doing that work, the tokens the step's token ids."""

from __future__ import annotations

import dataclasses
import json

import pytest
from test_fuzz import run_cli

from autoshard.graph.recompute import with_recomputation
from autoshard.graph.schema import graph_from_json
from autoshard.models import GPTConfig, gpt
from autoshard.models.training import training_precision
from autoshard.search.throughput import throughput

CONFIG = GPTConfig(layers=2, hidden=32, heads=4, seq=16, batch=4, vocab=64, style="megatron")


def step(precision: str, dtype: str = "bf16"):
    with training_precision(precision):
        return graph_from_json(gpt(dataclasses.replace(CONFIG, dtype=dtype), training=True))


def test_recomputation_and_the_optimizer_add_no_model_flops():
    graph = step("bf16-mixed")
    rates = throughput(graph, "dgx-a100")
    phases = graph.phases
    assert rates.model_flops == sum(op.flops() for op in graph.ops if phases[op.name] != "optimizer")
    assert rates.model_flops < graph.total_flops()
    recomputed = with_recomputation(graph, "full")
    assert recomputed.total_flops() > graph.total_flops()
    assert throughput(recomputed, "dgx-a100").model_flops == rates.model_flops
    assert rates.tokens == CONFIG.batch * CONFIG.seq
    assert rates.peak_flops_per_s == 312e12  # bf16 does the matmuls
    assert throughput(step("fp32", "f32"), "dgx-a100").peak_flops_per_s == 156e12
    assert rates.of(2.0, 8) == {"tokens_per_s_per_device": pytest.approx(CONFIG.batch * CONFIG.seq / 2.0 / 8),
                                "mfu": pytest.approx(rates.model_flops / (2.0 * 8 * 312e12))}


def test_the_search_ranks_with_tokens_per_second_and_mfu(tmp_path):
    path = tmp_path / "g.json"
    with training_precision("bf16-mixed"):
        path.write_text(json.dumps(gpt(CONFIG, training=True)))
    code, out, err = run_cli("search", str(path), "--devices", "2", "--topology", "dgx-h100", "--max-axes", "1",
                             "--time-limit", "3", "-o", str(tmp_path / "out"))
    assert code == 0, err
    ranking = json.loads((tmp_path / "out" / "ranking.json").read_text())
    rates = throughput(step("bf16-mixed"), "dgx-h100")
    assert ranking["model_flops_per_step"] == rates.model_flops and ranking["tokens_per_step"] == rates.tokens
    solved = [row for row in ranking["ranking"] if row["outcome"] == "solved"]
    assert solved
    for row in solved:
        assert row["mfu"] == pytest.approx(rates.model_flops / (row["step_s"] * 2 * 989e12))
        assert row["tokens_per_s_per_device"] == pytest.approx(rates.tokens / row["step_s"] / 2)
    assert " MFU " in out and f"{100 * solved[0]['mfu']:.1f}%" in out
