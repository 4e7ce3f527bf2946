"""Each pipeline stage's memory as the solver sees it (`planning/stage_memory.py`): on a cut, the
problem's usage at each stage's step equals the stage's peak as the pipeline prices it, and a
step whose stages no whole-graph budget could fit is planned within one budget per stage."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
from test_fuzz import run_cli

from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.models import GPTConfig, gpt
from autoshard.models.training import training_precision
from autoshard.planning.hardware import bind_hardware
from autoshard.planning.make_plan import SolveSettings, make_plan
from autoshard.planning.pipeline_plan import (PipelineSettings, checked_orders, pipeline_mesh, price_pipeline,
                                              stage_plan)
from autoshard.planning.pipeline_stages import op_positions
from autoshard.planning.pipeline_work import work_kinds
from autoshard.planning.stage_memory import staged_formulation

MESH = Mesh.of(tp=2)
CONFIG = GPTConfig(layers=4, hidden=64, heads=4, seq=32, batch=8, vocab=128, style="megatron")


@pytest.fixture(scope="module")
def step():
    with training_precision("bf16-mixed"):
        return graph_from_json(gpt(CONFIG, training=True), MESH)


@pytest.mark.parametrize("schedule,chunks", [("1f1b", 1), ("gpipe", 1)])
def test_the_staged_usage_of_a_plan_is_each_stages_priced_peak(step, schedule, chunks):
    hw = bind_hardware("dgx-h100", pipeline_mesh(MESH, 2))
    orders = checked_orders(step, PipelineSettings(2, schedule, chunks), 4)
    cut = [0, 0, 1, 1]
    formulations = []

    def staged(formulation):
        graph = formulation.graph
        positions = op_positions(graph)
        made = staged_formulation(formulation, {name: cut[p] for name, p in positions.items()},
                                  work_kinds(graph, positions), orders, 2**40)
        formulations.append(made)
        return made

    settings = SolveSettings(time_limit_s=3, microbatches=4, memory_budget_bytes=2**40, deterministic=True)
    result = replace(make_plan(step, MESH, hw, settings, memory=staged), cut=tuple(cut))
    priced = price_pipeline(result, MESH, hw, orders, math.inf)
    formulation = formulations[0]
    problem, solution = formulation.problem, formulation.solution(result.plan, {})
    assert problem.intervals.max() == 2  # one step per stage
    usage = np.zeros(2, dtype=np.int64)
    for node, pick in enumerate(solution):
        start, end = problem.intervals[node]
        usage[start:end] += problem.node_usages[node][pick]
    assert usage.tolist() == [m.peak_bytes for m in priced.memory]


def test_stages_fit_where_no_whole_graph_budget_fits_them(tmp_path):
    """GPipe holds 8 microbatches on both stages: the whole-graph budget shrunk to the fullest
    stage left both over 1.5 MiB; the solve with each stage's memory on its own fits them."""
    config = GPTConfig(layers=2, hidden=32, heads=2, seq=64, batch=32, vocab=64)
    path = tmp_path / "gpt.json"
    path.write_text(json.dumps(gpt(config, training=True)))
    code, out, err = run_cli("plan", str(path), "--mesh", "dp=2", "--deterministic", "--verify", "never",
                             "--pipeline", "2", "--microbatches", "8", "--schedule", "gpipe", "--memory-budget",
                             "1.5MiB", "-o", str(tmp_path / "out"))
    assert code == 0, err
    pipeline = json.loads((tmp_path / "out" / "plan.json").read_text())["pipeline"]
    assert all(stage["memory"]["peak_bytes"] <= 1.5 * 2**20 for stage in pipeline["stages"])
    assert all(stage["memory"]["inflight_chunks"] == 8 for stage in pipeline["stages"])


def test_stage_plan_fits_on_the_cut_it_was_given(step):
    hw = bind_hardware("dgx-h100", pipeline_mesh(MESH, 2))
    orders = checked_orders(step, PipelineSettings(2, "1f1b"), 4)
    settings = SolveSettings(time_limit_s=3, microbatches=4, deterministic=True)
    result = stage_plan(step, MESH, hw, settings, orders, part_at=[0, 1, 1, 1])
    assert result.cut == (0, 1, 1, 1)
    priced = price_pipeline(result, MESH, hw, orders, math.inf)
    assert [part.layers for part in priced.parts] == [(0, 0), (1, 3)]
