"""Every outcome has its own exit code and reason, in the CLI and over REST: a time budget spent
before any plan (5, `timeout`), an infeasible instance (3, `infeasible`), a service that cannot
start (2, naming the flag); and REST takes the CLI's options with the CLI's refusals, at submission,
without reading `true` as a number or `"yes"` as a boolean."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest

from autoshard.cli.main import INFEASIBLE, OUT_OF_TIME, main
from autoshard.models.gpt import GPTConfig, gpt
from support.service import MLP

IOPDDL_EXAMPLE = Path(__file__).parent / "data" / "iopddl_example.json"
SMALL_GPT = gpt(GPTConfig(layers=1, hidden=64, heads=4, seq=16, batch=2, vocab=128))


def test_a_search_whose_time_budget_runs_out_before_any_plan_exits_5_saying_so(tmp_path, capsys):
    graph = tmp_path / "gpt.json"
    graph.write_text(json.dumps(SMALL_GPT))
    assert main(["search", str(graph), "--devices", "16", "--max-axes", "2", "--jobs", "1",
                 "--time-budget", "0.001"]) == OUT_OF_TIME
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith("autoshard search: out of time: the search's time budget ran out before any "
                              "candidate had a plan"), err
    assert "memory budget" not in err[-1]


def test_a_search_whose_time_budget_runs_out_over_rest_fails_with_a_timeout(http):
    request = {"graph": MLP, "devices": 16, "topology": "dgx-h100",
               "options": {"max_axes": 2, "time_budget_s": 0.001}}
    response = http.post("/v1/searches?wait=60", json=request)
    assert response.status_code in (200, 202), response.json()
    location, body = response.headers["Location"], response.json()
    deadline = time.monotonic() + 120
    while body["status"] in ("queued", "searching") and time.monotonic() < deadline:
        time.sleep(0.2)
        body = http.get(location).json()
    assert body["status"] == "failed" and body["plan"] is None
    assert body["error"]["kind"] == "timeout" and "time budget ran out" in body["error"]["message"]
    assert body["ranking"]["counts"]["unsolved"] > 0


def test_an_infeasible_iopddl_instance_exits_3_and_still_writes_the_answer(tmp_path, capsys):
    document = json.loads(IOPDDL_EXAMPLE.read_text())
    document["problem"]["usage_limit"] = 5  # below the first node's only strategy
    problem, out = tmp_path / "tight.json", tmp_path / "answer.json"
    problem.write_text(json.dumps(document))
    assert main(["iopddl", str(problem), "--time-limit", "5", "-q", "-o", str(out)]) == INFEASIBLE
    assert capsys.readouterr().err.startswith("autoshard iopddl: infeasible: no assignment fits the usage limit")
    assert json.loads(out.read_text())["feasible"] is False


def test_serve_refuses_a_port_in_use_and_an_unknown_host_with_exit_2_naming_the_flag(tmp_path, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        assert main(["serve", "--port", port, "--db", str(tmp_path / "plans.sqlite3")]) == 2
        assert "  --port: cannot listen on 127.0.0.1:" in capsys.readouterr().err
    assert main(["serve", "--host", "no-such-host.invalid", "--port", "0", "--db", str(tmp_path / "plans.sqlite3")]) == 2
    assert "  --host: cannot listen on 'no-such-host.invalid'" in capsys.readouterr().err


def test_rest_takes_the_clis_plan_options(http):
    options = {"mesh_order_splits": True, "collective_optimizations": False, "layer_once": True,
               "deterministic": True, "time_limit_s": 5}
    layered = MLP | {"ops": [op | {"layer": i} for i, op in enumerate(MLP["ops"])]}
    body = {"graph": layered, "mesh": "dp=2,tp=2", "topology": "dgx-h100", "options": options}
    response = http.post("/v1/plans?wait=60", json=body)
    assert response.status_code == 200 and response.json()["status"] == "done", response.json()
    plan = response.json()["plan"]
    assert "composition" in plan["solver"]  # --layer-once
    assert "collective_optimizations" not in plan  # --no-collective-opt
    search = {"graph": MLP, "devices": 8, "topology": "dgx-h100", "options": {"mesh_order_splits": True, "max_axes": 1}}
    assert http.post("/v1/searches", json=search).status_code == 202


def test_rest_refuses_layer_once_with_microbatches_as_the_cli_does(http):
    body = {"graph": MLP, "mesh": "dp=2", "topology": "dgx-h100", "options": {"layer_once": True, "microbatches": 2}}
    response = http.post("/v1/plans", json=body)
    assert response.status_code == 422
    assert "/options/layer_once" in [p["where"] for p in response.json()["error"]["problems"]]


@pytest.mark.parametrize("fix, where", [
    ({"a0": 2}, "/options/fix/a0"),  # a0, a1, ... name the axes that are not fixed
    ({"t p": 2}, "/options/fix/t p"),  # no mesh axis has that name
])
def test_rest_refuses_the_fixed_axes_the_cli_refuses_at_submission(http, fix, where):
    response = http.post("/v1/searches", json={"graph": MLP, "devices": 8, "topology": "dgx-h100",
                                               "options": {"fix": fix}})
    assert response.status_code == 422
    assert [p["where"] for p in response.json()["error"]["problems"]] == [where]


def test_rest_refuses_ray_without_ray_at_submission(http, monkeypatch):
    import service.routes.searches as routes

    monkeypatch.setattr(routes, "ray_installed", lambda: False)
    response = http.post("/v1/searches", json={"graph": MLP, "devices": 8, "topology": "dgx-h100",
                                               "options": {"ray": True}})
    assert response.status_code == 422
    problems = response.json()["error"]["problems"]
    assert [p["where"] for p in problems] == ["/options/ray"] and "autoshard[ray]" in problems[0]["message"]


@pytest.mark.parametrize("path, options, field", [
    ("/v1/plans", {"time_limit_s": True}, "time_limit_s"),
    ("/v1/plans", {"deterministic": "yes"}, "deterministic"),
    ("/v1/plans", {"seed": "1"}, "seed"),
    ("/v1/plans", {"microbatches": 2.0}, "microbatches"),
    ("/v1/plans", {"weights": {"time": True}}, "weights"),
    ("/v1/searches", {"max_axes": True}, "max_axes"),
    ("/v1/searches", {"deterministic": "yes"}, "deterministic"),
    ("/v1/searches", {"fix": {"tp": "2"}}, "fix"),
])
def test_rest_does_not_coerce_booleans_and_strings_into_options(http, path, options, field):
    body = {"graph": MLP, "topology": "dgx-h100", "options": options}
    body |= {"mesh": "dp=2,tp=2"} if path == "/v1/plans" else {"devices": 8}
    response = http.post(path, json=body)
    assert response.status_code == 422
    assert any(p["where"].startswith(f"/options/{field}") for p in response.json()["error"]["problems"])
