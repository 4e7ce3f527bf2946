"""Deterministic mode: the solver's work is bounded by a fixed budget instead of the clock, so the
same request gives the same plan.json (apart from its timing fields) from the CLI, the service
and the Python API."""

from __future__ import annotations

import json

from autoshard.cli.main import main
from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.models import GPTConfig, gpt
from autoshard.planning.hardware import bind_hardware
from autoshard.planning.make_plan import SolveSettings, make_plan
from autoshard.planning.plan import plan_to_json
from autoshard.solver import solve
from support.service import MLP
from support.solver_problems import random_problem

TIMING_KEYS = ("formulate_s", "solve_s", "first_feasible_s")
CONFIG = GPTConfig(layers=2, hidden=256, heads=4, seq=128, batch=4, vocab=1000)


def without_timing(document: dict) -> dict:
    solver = {k: v for k, v in document["solver"].items() if k not in TIMING_KEYS}
    return {**{k: v for k, v in document.items() if k != "phases"}, "solver": solver}


def test_two_cli_runs_write_the_same_plan_apart_from_timing(tmp_path):
    graph = tmp_path / "gpt.json"
    graph.write_text(json.dumps(gpt(CONFIG, training=True)))
    texts = []
    for run in ("first", "second"):
        args = [str(graph), "--mesh", "dp=2,tp=2", "--topology", "dgx-h100", "--deterministic", "--verify", "never",
                "--time-limit", "0.01", "-o", str(tmp_path / run)]
        assert main(["plan", *args]) == 0
        texts.append((tmp_path / run / "plan.json").read_text())
    first, second = (json.loads(text) for text in texts)
    assert set(first["solver"]) >= set(TIMING_KEYS)
    assert without_timing(first) == without_timing(second)
    # everything but the timing lines is byte-identical, not just equal as JSON
    def untimed(text: str) -> list[str]:
        return [line for line in text.split('\n "phases"')[0].splitlines()
                if not any(f'"{k}"' in line for k in TIMING_KEYS)]

    assert untimed(texts[0]) == untimed(texts[1])


def test_the_service_option_gives_the_python_api_plan(client):
    document = MLP
    job = client.submit(document, "dp=2,tp=2", "dgx-h100", options={"deterministic": True, "verify": "never", "workers": 1},
                        wait_s=120)
    assert job.status == "done", job.error
    mesh = Mesh.parse("dp=2,tp=2")
    direct = make_plan(graph_from_json(document, mesh), mesh, bind_hardware("dgx-h100", mesh),
                       SolveSettings(deterministic=True, workers=1))
    assert job.plan["solver"]["objective_ps"] == direct.solver["objective_ps"]
    assert job.plan["ops"] == {op: {**entry, "option": direct.plan.options[op].to_json()}
                               for op, entry in job.plan["ops"].items()}
    assert job.plan["tensors"] == plan_to_json(direct.plan)["tensors"]


def test_the_time_limit_does_not_change_a_deterministic_answer():
    problem = random_problem(7, limited=True)
    short = solve(problem, time_limit_s=0.01, deterministic=True)
    long = solve(problem, time_limit_s=30.0, deterministic=True)
    assert (short.solution, short.cost, short.lower_bound) == (long.solution, long.cost, long.lower_bound)
