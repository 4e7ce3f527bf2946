"""Generated inputs, valid and broken, through the CLI's entry point and the service: every one
gets an answer (exit 0-3, HTTP 2xx/4xx), never a traceback or exit 4, and every graph `validate`
accepts is planned (or refused as infeasible, with the reason). Budgets are fixed and the
examples derandomised, so a run is the same every time and takes about a minute."""

from __future__ import annotations

import io
import json
import tempfile
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import hypothesis
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import content_type_conformance, status_code_conformance

from autoshard.cli.main import main
from autoshard.client import Client
from autoshard.errors import AutoshardError
from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.planning.plan import plan_from_json, plan_to_json
from service.app import create_app
from support.fuzz import any_graph, any_mesh, graphs, meshes, plans
from support.service import settings_for

FIXED = {"deadline": None, "derandomize": True, "database": None,
         "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large]}
EXIT_CODES = (0, 1, 2, 3)  # 1 a verification failed, 2 bad input, 3 no feasible plan; 4 would be a bug


def cli(*argv: str) -> tuple[int, str]:
    """Exit code and everything printed by `autoshard ARGV...`, run in this process."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as stop:  # argparse's own usage errors
            code = stop.code if isinstance(stop.code, int) else 2
    return code, out.getvalue() + err.getvalue()


def assert_answered(code: int, text: str) -> None:
    assert code in EXIT_CODES, text
    assert "Traceback" not in text and "internal error" not in text, text


def write(directory: Path, name: str, value: Any) -> str:
    path = directory / name
    path.write_text(json.dumps(value))
    return str(path)


@settings(max_examples=300, **FIXED)
@given(document=any_graph(), mesh=any_mesh())
def test_every_graph_validate_accepts_is_planned(document, mesh):
    with tempfile.TemporaryDirectory() as tmp:
        graph = write(Path(tmp), "graph.json", document)
        code, text = cli("validate", graph, f"--mesh={mesh}")
        assert_answered(code, text)
        hypothesis.event(f"validate exit {code}")
        if code != 0:
            assert "problem" in text or "error:" in text, text  # a reason, naming what is wrong
            return
        code, text = cli("plan", graph, f"--mesh={mesh}", "--time-limit=2", "-o", str(Path(tmp) / "out"))
        assert code in (0, 3), text
        assert "Traceback" not in text
        if code == 3:
            assert "infeasible:" in text and "budget" in text, text
            return
        code, text = cli("estimate", graph, f"--mesh={mesh}", "--plan", str(Path(tmp) / "out" / "plan.json"))
        assert code == 0, text


def whole_plan(document: Any, mesh: str, plan: Any) -> dict[str, Any] | None:
    """`plan` (options and shardings for some ops and tensors) written out as a whole
    `autoshard.plan/v1` document, the rest derived; None if it does not fit the graph."""
    try:
        parsed = Mesh.parse(mesh)
        return plan_to_json(plan_from_json(plan, graph_from_json(document, parsed), parsed))
    except AutoshardError:
        return None


@settings(max_examples=100, **FIXED)
@given(data=st.data())
def test_every_plan_for_a_graph_is_answered_by_estimate_simulate_and_emit(data):
    document, mesh = data.draw(graphs()), data.draw(meshes())
    plan = data.draw(plans(document, [axis.split("=")[0] for axis in mesh.split(",")]))
    written = data.draw(st.sampled_from(["as drawn", "whole", "whole, derived"]))
    whole = whole_plan(document, mesh, {} if written == "whole, derived" else plan) if written != "as drawn" else None
    plan = whole if whole is not None else plan  # a document the contract accepts gets past the commands' door
    with tempfile.TemporaryDirectory() as tmp:
        graph, plan_path = write(Path(tmp), "graph.json", document), write(Path(tmp), "plan.json", plan)
        for command in ("estimate", "simulate", "emit"):
            code, text = cli(command, graph, f"--mesh={mesh}", "--plan", plan_path,
                             *(["-o", str(Path(tmp) / "out.mlir")] if command == "emit" else []))
            assert_answered(code, text)
            hypothesis.event(f"{command} exit {code}")
            if command == "simulate":
                assert code != 1, text  # a plan the CLI accepts computes what its graph computes


@settings(max_examples=60, **FIXED)
@given(document=any_graph(), mesh=any_mesh(), data=st.data())
def test_the_service_answers_every_body_without_a_server_error(document, mesh, data):
    plan = data.draw(plans(document))
    with tempfile.TemporaryDirectory() as tmp:
        settings_ = settings_for(Path(tmp), max_body_bytes=200_000, max_time_limit_s=2, stop_grace_s=1)
        with TestClient(create_app(settings_), raise_server_exceptions=False) as http:
            for route, body in (("/v1/validate", {"graph": document, "mesh": mesh}),
                                ("/v1/validate", {"graph": document, "mesh": mesh, "plan": plan}),
                                ("/v1/estimate", {"graph": document, "mesh": mesh, "plan": plan}),
                                ("/v1/plans", {"graph": document, "mesh": mesh, "options": {"time_limit_s": 1}})):
                response = http.post(route, json=body)
                hypothesis.event(f"{route} {response.status_code}")
                assert 200 <= response.status_code < 500, (route, response.text)
                assert "Traceback" not in response.text
                if response.status_code >= 400:
                    error = response.json()["error"]
                    assert error["message"] and error["kind"] != "internal", error
                elif route == "/v1/plans":
                    # what the door lets in is planned (or proved infeasible), never failed later
                    job = Client(http=http).poll(response.json()["id"], timeout_s=120, interval_s=0.05)
                    assert job.status == "done" or (job.status, job.error["kind"]) == ("failed", "infeasible"), job


def test_generated_requests_for_every_operation_of_the_app(tmp_path):
    """schemathesis against the ASGI app in this process: valid and invalid requests for every
    operation (at most 2 x 15 each), no 5xx, every status and content type as documented."""
    settings_ = settings_for(tmp_path, max_wait_s=0.2, max_time_limit_s=2, default_time_limit_s=1, stop_grace_s=1)
    app = create_app(settings_)
    with TestClient(app):  # runs the app's startup: its plan store and job runner
        schema = schemathesis.openapi.from_asgi("/openapi.json", app)
        for result in schema.get_all_operations():
            operation = result.ok()
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                @given(case=operation.as_strategy(generation_mode=mode))
                @settings(max_examples=15, deadline=None, derandomize=True, database=None,
                          suppress_health_check=list(HealthCheck))
                def check(case):
                    case.call_and_validate(checks=[not_a_server_error, status_code_conformance,
                                                   content_type_conformance])

                try:
                    check()
                except hypothesis.errors.Unsatisfiable:
                    assert mode is GenerationMode.NEGATIVE, operation.label  # no invalid request exists
