"""Generated inputs, valid and broken, through the CLI's entry point and the service: every one
gets an answer (exit 0-3, HTTP 2xx/4xx), never a traceback or exit 4, and every graph `validate`
accepts is planned (or refused as infeasible, with the reason). Then the classes of input that
must be refused at the door, each with its documented answer:

- hand-edited plans: a whole plan for a generated graph with one edit (an op or tensor dropped
  or misspelled, `tensors` null, an op's kind changed, `format` missing or wrong, a larger mesh,
  an unknown key, a huge integer anywhere, nonsense resharding steps, a wrong source, target or
  consumer) is refused by `emit`, `simulate`, `estimate` (exit 2, nothing printed or written),
  `/v1/estimate` and `/v1/validate` (422), each naming the edited field's JSON pointer;
- numbers in other scripts' digits (superscripts, Arabic-Indic, fullwidth, ...) in meshes,
  shapes and numeric flags, and names holding lone surrogates, in the CLI (exit 2 naming the
  flag and the character) and REST (422 naming the pointer; no job stored);
- the user's own code failing in `autoshard import torch|jax FILE:FACTORY` (a syntax error, an
  import error, an exception at import or in the factory, a factory that takes arguments):
  exit 2 naming the file, the line and the exception;
- Ctrl-C at a random moment of `plan`, in a subprocess: exit 130, one line, no traceback, and
  a plan.json written only with its solver status `interrupted`.

A case that finds a bug still open is marked `xfail(strict=True)` with the bug as its reason.
Budgets are fixed and the examples derandomised, so a run is the same every time (the
interrupts' delays are drawn from a seeded generator) and takes about two minutes."""

from __future__ import annotations

import io
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import content_type_conformance, status_code_conformance

from autoshard.cli.main import main
from autoshard.client import Client
from autoshard.encodable import printable
from autoshard.errors import AutoshardError
from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.planning.hardware import bind_hardware
from autoshard.planning.plan import plan_from_json, plan_to_json
from autoshard.planning.plan_contract import read_plan
from autoshard.planning.report import estimate
from service.app import create_app
from support.fuzz import (HAND_EDITS, LONE_SURROGATES, RESHARDING_EDITS, any_graph, any_mesh, graphs, hand_edits,
                          json_text, meshes, op_options, other_digit_numbers, plans)
from support.service import MLP, error_of, settings_for

FIXED = {"deadline": None, "derandomize": True, "database": None,
         "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large]}
EXIT_CODES = (0, 1, 2, 3)  # 1 a verification failed, 2 bad input, 3 no feasible plan; 4 would be a bug


def run_cli(*argv: str) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of `autoshard ARGV...`, run in this process."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as stop:  # argparse's own usage errors
            code = stop.code if isinstance(stop.code, int) else 2
    return code, out.getvalue(), err.getvalue()


def cli(*argv: str) -> tuple[int, str]:
    """Exit code and everything printed by `autoshard ARGV...`, run in this process."""
    code, out, err = run_cli(*argv)
    return code, out + err


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
        if code == 3:  # over the memory budget, or a pinned sharding no option of its producer makes
            assert "infeasible:" in text and ("budget" in text or "pinned sharding" in text), text
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


@pytest.fixture(scope="module")
def http(tmp_path_factory):
    """One service app for the refusal tests below: nothing they send may be stored."""
    settings_ = settings_for(tmp_path_factory.mktemp("service"), max_body_bytes=200_000, max_time_limit_s=2)
    with TestClient(create_app(settings_), raise_server_exceptions=False) as client:
        yield client
        assert client.app.state.store.counts() == {}


def named(wanted: str, found: list[str]) -> bool:
    """Whether a problem was reported at pointer `wanted` or under it."""
    return any(where == wanted or where.startswith(wanted + "/") for where in found)


def cli_pointers(err: str) -> list[str]:
    """The JSON pointers (or flags) of the problems a refusal lists, one `  WHERE: message` each."""
    return [line[2:].split(": ")[0] for line in err.splitlines() if line.startswith("  ")]


def valid_whole_plan(document: dict[str, Any], mesh: str, plan: Any) -> dict[str, Any]:
    """A whole plan document for the graph on `mesh`, from `plan`'s options and shardings where
    they fit (else all derived), with the reshardings `estimate` prices, as `plan` writes it."""
    parsed = Mesh.parse(mesh)
    graph = graph_from_json(document, parsed)
    try:
        built = plan_from_json(plan, graph, parsed)
    except AutoshardError:
        built = plan_from_json({}, graph, parsed)
    whole = plan_to_json(built)
    reshardings = estimate(built, bind_hardware("dgx-h100", parsed)).to_json()["reshardings"]
    if reshardings:
        whole["reshardings"] = reshardings
    read_plan(whole, graph, parsed)  # the unedited document keeps the contract
    return whole


@pytest.mark.parametrize("how", HAND_EDITS)
@settings(max_examples=8, **FIXED)
@given(data=st.data())
def test_a_hand_edited_plan_is_refused_naming_the_edit(http, how, data):
    # even dims on meshes of 2 and 4 devices an axis: most options fit, and most plans reshard
    document, mesh = data.draw(graphs(dims=st.sampled_from([4, 8, 16]))), data.draw(meshes(sizes=(2, 4)))
    document.pop("constraints", None)  # the plan is its own: no pins to keep
    axes = [axis.split("=")[0] for axis in mesh.split(",")]
    whole = valid_whole_plan(document, mesh, data.draw(op_options(document, axes)))
    hypothesis.assume(how not in RESHARDING_EDITS or whole.get("reshardings"))
    edited, pointers = data.draw(hand_edits(whole, how))
    with tempfile.TemporaryDirectory() as tmp:
        graph, plan_path, output = write(Path(tmp), "graph.json", document), Path(tmp) / "plan.json", Path(tmp) / "out"
        plan_path.write_text(json_text(edited))
        for command in ("emit", "simulate", "estimate"):
            code, out, err = run_cli(command, graph, f"--mesh={mesh}", "--plan", str(plan_path),
                                     *(["-o", str(output)] if command == "emit" else []))
            assert (code, out) == (2, ""), (command, code, out, err)  # no IR, no verdict, no price
            assert not output.exists()
            found = cli_pointers(err)
            for wanted in pointers:  # the CLI may name a plan's other mesh by the flag it differs from
                assert named(wanted, found) or (wanted == "/mesh" and "--mesh" in found), (command, wanted, err)
    body = json_text({"graph": document, "mesh": mesh, "plan": edited})
    for route in ("/v1/estimate", "/v1/validate"):
        response = http.post(route, content=body, headers={"content-type": "application/json"})
        assert response.status_code == 422, (route, response.text)
        found = [problem["where"] for problem in error_of(response)["problems"]]
        assert all(named("/plan" + wanted, found) for wanted in pointers), (route, pointers, found)


ROUTES = ("/v1/plans", "/v1/estimate", "/v1/validate")

# Where the CLI reads a number, with N standing for it, and the flag its refusal names.
NUMBER_FLAGS = {
    "validate --mesh": (["validate", "examples/mlp.json", "--mesh", "dp=N"], "--mesh dp"),
    "plan --mesh": (["plan", "examples/mlp.json", "--mesh", "dp=2,tp=N"], "--mesh tp"),
    "plan --seed": (["plan", "examples/mlp.json", "--mesh", "dp=2", "--seed", "N"], "argument --seed"),
    "plan --time-limit": (["plan", "examples/mlp.json", "--mesh", "dp=2", "--time-limit", "N"],
                          "argument --time-limit"),
    "plan --workers": (["plan", "examples/mlp.json", "--mesh", "dp=2", "--workers", "N"], "argument --workers"),
    "plan --microbatches": (["plan", "examples/mlp.json", "--mesh", "dp=2", "--microbatches", "N"],
                            "argument --microbatches"),
    "plan --memory-budget": (["plan", "examples/mlp.json", "--mesh", "dp=2", "--memory-budget", "NGiB"],
                             "--memory-budget"),
    "plan --gap-limit": (["plan", "examples/mlp.json", "--mesh", "dp=2", "--gap-limit", "0.N"], "argument --gap-limit"),
    "plan --weights": (["plan", "examples/mlp.json", "--mesh", "dp=2", "--weights", "time=N"], "--weights"),
    "plan --slice": (["plan", "examples/mlp.json", "--mesh", "dp=2", "--topology", "tpu-v5p", "--slice", "2xN"],
                     "--slice"),
    "plan --nodes": (["plan", "examples/mlp.json", "--mesh", "dp=2", "--nodes", "N"], "argument --nodes"),
    "plan --pipeline": (["plan", "examples/mlp.json", "--mesh", "dp=2", "--pipeline", "N"], "argument --pipeline"),
    "estimate --microbatches": (["estimate", "examples/mlp.json", "--mesh", "dp=2", "--microbatches", "N"],
                                "argument --microbatches"),
    "generate --layers": (["generate", "mlp", "--layers", "N", "-o", "never-written.json"], "argument --layers"),
    "reshard --shape": (["reshard", "--mesh", "x=2", "--shape", "6xN", "--from", "{}", "--to", "{}"], "--shape"),
    "search --devices": (["search", "examples/mlp.json", "--devices", "N"], "argument --devices"),
    "collective --bytes": (["collective", "all_reduce", "--mesh", "x=2", "--bytes", "NMiB"], "--bytes"),
    "iopddl --time-limit": (["iopddl", "tests/data/iopddl_example.json", "--time-limit", "N"], "argument --time-limit"),
}


def odd_character_named(number: str, text: str) -> bool:
    """Whether `text` names the first character of `number` outside ASCII, by code point."""
    odd = next(c for c in number if not c.isascii())
    return f"(U+{ord(odd):04X}" in text and "is not an ASCII character" in text


@pytest.mark.parametrize("place", NUMBER_FLAGS)
@settings(max_examples=3, **FIXED)
@given(number=other_digit_numbers())
def test_a_number_in_other_digits_exits_2_naming_the_flag_and_character(place, number):
    argv, flag = NUMBER_FLAGS[place]
    code, out, err = run_cli(*(arg.replace("N", number) if "N" in arg else arg for arg in argv))
    assert (code, out) == (2, ""), err
    assert f"{flag}: " in err and odd_character_named(number, err), err
    assert not Path("never-written.json").exists()


# Where a request holds a number, with N standing for it, the routes that read it, and the pointer
# its 422 names; a text is read by autoshard (which names the character), a size must be a JSON
# integer (so the type is what is wrong).
REST_NUMBERS = {
    "mesh text": ({"mesh": "dp=2,tp=N"}, ROUTES, "/mesh/tp"),
    "mesh axis size": ({"mesh": {"axes": [{"name": "dp", "size": "N"}]}}, ROUTES, "/mesh/axes/0/size"),
    "slice": ({"mesh": "dp=2", "topology": "tpu-v5p", "topology_options": {"slice": "2xN"}},
              ("/v1/plans", "/v1/estimate"), "/topology_options/slice"),
}


@pytest.mark.parametrize("route, place", [(route, place) for place, (_, routes, _) in REST_NUMBERS.items()
                                          for route in routes])
@settings(max_examples=3, **FIXED)
@given(number=other_digit_numbers())
def test_rest_numbers_in_other_digits_are_422_naming_the_pointer(http, route, place, number):
    fields, _, where = REST_NUMBERS[place]
    body = json.loads(json.dumps(fields).replace("N", number)) | {"graph": MLP}
    response = http.post(route, json=body | ({"plan": {}} if route == "/v1/estimate" else {}))
    assert response.status_code == 422, response.text
    problems = [p for p in error_of(response)["problems"] if p["where"] == where]
    assert problems, error_of(response)
    if place != "mesh axis size":
        assert odd_character_named(number, problems[0]["message"]), problems
    assert http.app.state.store.counts() == {}  # never stored


def rename(document: dict[str, Any], which: str, name: str) -> tuple[dict[str, Any], str]:
    """`document` with its graph name, first op name or first tensor name (and every use of it)
    replaced by `name`; and the pointer that names it."""
    if which == "graph":
        return document | {"name": name}, "/name"
    if which == "op":
        document["ops"][0]["name"] = name
        return document, "/ops/0/name"
    old = next(iter(document["tensors"]))
    document["tensors"] = {name if key == old else key: value for key, value in document["tensors"].items()}
    for op in document["ops"]:
        op["inputs"] = [name if tensor == old else tensor for tensor in op["inputs"]]
    return document, "/tensors/" + printable(name)


@settings(max_examples=12, **FIXED)
@given(document=graphs(), which=st.sampled_from(["graph", "op", "tensor"]), surrogate=LONE_SURROGATES,
       at=st.integers(0, 3))
def test_a_name_utf8_cannot_encode_is_refused_at_the_door_and_never_stored(http, document, which, surrogate, at):
    name = "name"[:at] + surrogate + "name"[at:]
    document, where = rename(document, which, name)
    with tempfile.TemporaryDirectory() as tmp:
        code, out, err = run_cli("validate", write(Path(tmp), "graph.json", document), "--mesh", "dp=2")
    # a tensor's name is also named where an op reads it
    surrogate_said = f"{printable(surrogate)} at character {at} is a lone surrogate"
    assert (code, out) == (2, ""), err
    assert f"  {where}: " in err and all(surrogate_said in line for line in err.splitlines()[1:]), err
    for route in ROUTES:
        body = {"graph": document, "mesh": "dp=2"} | ({"plan": {}} if route == "/v1/estimate" else {})
        response = http.post(route, content=json.dumps(body), headers={"content-type": "application/json"})
        assert response.status_code == 422, response.text
        problems = error_of(response)["problems"]
        assert "/graph" + where in [p["where"] for p in problems], problems
        assert all(surrogate_said in p["message"] for p in problems), problems
    assert http.app.state.store.counts() == {}


@settings(max_examples=4, **FIXED)
@given(surrogate=LONE_SURROGATES)
def test_a_mesh_axis_name_holding_a_surrogate_is_refused(http, surrogate):
    # what Python makes of bytes in argv that are not UTF-8 (surrogateescape), or a \\ud800 in JSON
    code, out, err = run_cli("validate", "examples/mlp.json", "--mesh", f"d{surrogate}p=2")
    assert (code, out) == (2, "") and f"  --mesh d{surrogate}p: axis name must be an identifier" in err, err
    response = http.post("/v1/plans", content=json.dumps({"graph": MLP, "mesh": f"d{surrogate}p=2"}),
                         headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text
    assert all(p["where"].startswith("/mesh") for p in error_of(response)["problems"]), error_of(response)


EXCEPTIONS = st.sampled_from(["ValueError", "RuntimeError", "TypeError", "FileNotFoundError", "AssertionError"])
MESSAGES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz ", min_size=1, max_size=20).map(str.strip).filter(bool)


@st.composite
def failing_user_files(draw: st.DrawFn, factory: str) -> tuple[str, str, int, str]:
    """A small user file whose loading or `factory` fails, after a few lines of preamble: how it
    fails, its text, the line the error must name and the start of what it must say (`{file}`
    standing for the file's name)."""
    lines = ["# a user's model file"] * draw(st.integers(0, 4)) + ["import math", ""]
    how = draw(st.sampled_from(["syntax error", "import error", "raise at import", "factory raises",
                                "helper raises", "factory takes arguments"]))
    error, message = draw(EXCEPTIONS), draw(MESSAGES)
    if how == "syntax error":
        lines.append(draw(st.sampled_from([f"def {factory}(:", "x = (1,", "return 1", "x = = 1"])))
        return how, "\n".join(lines) + "\n", len(lines), "importing {file} raised SyntaxError: "
    if how == "import error":
        lines.append(f"import no_such_module_{message.replace(' ', '_')}")
        return how, "\n".join(lines) + "\n", len(lines), "importing {file} raised ModuleNotFoundError: No module named"
    if how == "raise at import":
        lines.append(f"raise {error}({message!r})")
        return how, "\n".join(lines) + "\n", len(lines), f"importing {{file}} raised {error}: {message}"
    if how == "factory takes arguments":
        lines += [f"def {factory}(size, depth=2):", "    return size"]
        return how, "\n".join(lines) + "\n", len(lines) - 1, f"{factory}() must take no arguments; it needs size"
    if how == "helper raises":
        lines += ["def load():", f"    raise {error}({message!r})", "", f"def {factory}():", "    return load()"]
        return how, "\n".join(lines) + "\n", len(lines) - 3, f"{factory}() raised {error}: {message}"
    lines += [f"def {factory}():", f"    raise {error}({message!r})"]
    return how, "\n".join(lines) + "\n", len(lines), f"{factory}() raised {error}: {message}"


@settings(max_examples=16, **FIXED)
@given(framework=st.sampled_from(["torch", "jax"]), factory=st.sampled_from(["make", "build_model"]), data=st.data())
def test_a_failure_in_the_users_code_exits_2_naming_file_line_and_exception(framework, factory, data):
    how, text, line, said = data.draw(failing_user_files(factory))
    hypothesis.event(f"{framework}: {how}")
    with tempfile.TemporaryDirectory() as tmp:
        source, output = Path(tmp) / "user_model.py", Path(tmp) / "graph.json"
        source.write_text(text)
        code, out, err = run_cli("import", framework, f"{source}:{factory}", "-o", str(output))
        assert (code, out, output.exists()) == (2, "", False), err
        assert err.splitlines()[:1] == ["autoshard import: 1 problem(s):"], err
        assert err.splitlines()[1].startswith(f"  {source}:{line}: {said.format(file=source.name)}"), (text, err)


# What the user's code may do that is not an ordinary exception: each is still the user's error.
ODD_USER_CODE = {
    "factory calls sys.exit": ("import sys\n\ndef make():\n    sys.exit(3)\n", 4, "make() raised SystemExit: 3"),
    "file calls sys.exit": ("import sys\nsys.exit('bye')\n", 2, "importing user_model.py raised SystemExit: bye"),
    "exception that cannot be printed": ("class Odd(Exception):\n    def __str__(self):\n        raise RuntimeError\n\n"
                                         "def make():\n    raise Odd()\n", 6, "make() raised Odd"),
}
@pytest.mark.parametrize("case", ODD_USER_CODE)
def test_odd_failures_of_the_users_code_are_the_users_errors_too(tmp_path, case):
    text, line, said = ODD_USER_CODE[case]
    source, output = tmp_path / "user_model.py", tmp_path / "graph.json"
    source.write_text(text)
    code, out, err = run_cli("import", "torch", f"{source}:make", "-o", str(output))
    assert (code, out, output.exists()) == (2, "", False), (code, out, err)
    assert err.splitlines()[1].startswith(f"  {source}:{line}: {said}"), err


# `autoshard` as its entry point runs it, saying on stderr when its modules are imported (Ctrl-C
# before then is the case below).
AFTER_IMPORTS = ("import sys\nfrom autoshard.cli.main import main\nprint('imported', file=sys.stderr, flush=True)\n"
                 "sys.exit(main(sys.argv[1:]))")
# Seconds from then to the signal: one while `plan` reads and formulates, one while it solves.
_delays = random.Random(36)
INTERRUPT_DELAYS_S = [round(_delays.uniform(0, 3), 2), round(_delays.uniform(3, 8), 2)]


@pytest.fixture(scope="module")
def gpt(tmp_path_factory) -> Path:
    """A training step that takes seconds to formulate and much longer to solve."""
    path = tmp_path_factory.mktemp("graphs") / "gpt.json"
    assert run_cli("generate", "gpt", "--training", "--layers", "4", "-o", str(path))[0] == 0
    return path


def interrupted_plan(command: list[str], delay_s: float, wait_for: str | None) -> tuple[int, str]:
    """Exit code and stderr of COMMAND (a Python command line running `plan`), sent SIGINT
    `delay_s` after it prints the line `wait_for` on stderr (or after it starts)."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        before = ""
        while wait_for is not None and not before.endswith(wait_for + "\n"):
            line = process.stderr.readline()
            assert line, before  # it ended before saying it had imported its modules
            before += line
        time.sleep(delay_s)
        assert process.poll() is None  # the signal comes while it runs
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    return process.returncode, err


def plan_argv(gpt: Path, output: Path) -> list[str]:
    return ["plan", str(gpt), "--mesh", "dp=2,tp=4", "--topology", "dgx-h100", "--time-limit", "60", "--gap-limit", "0",
            "--verify", "never", "-o", str(output)]


@pytest.mark.parametrize("delay_s", INTERRUPT_DELAYS_S)
def test_ctrl_c_at_a_random_moment_of_plan_exits_130_with_one_line(gpt, tmp_path, delay_s):
    code, err = interrupted_plan([sys.executable, "-c", AFTER_IMPORTS, *plan_argv(gpt, tmp_path)], delay_s,
                                 wait_for="imported")
    lines = [line for line in err.splitlines() if not line.startswith("  ")]  # progress lines are indented
    assert code == 130 and "Traceback" not in err and len(lines) == 1, err
    written = tmp_path / "plan.json"
    if written.exists():
        assert lines[0].startswith(f"autoshard plan: interrupted; wrote the best plan found so far to {written}")
        document = json.loads(written.read_text())
        assert (document["solver"]["status"], document["verification"]["status"]) == ("interrupted", "skipped")
    else:
        assert lines[0] in ("autoshard: interrupted",  # while the commands' modules are imported
                            "autoshard plan: interrupted before the solver had found a plan; nothing was written")


def test_ctrl_c_as_plan_starts_exits_130_with_one_line(gpt, tmp_path):
    code, err = interrupted_plan([sys.executable, "-m", "autoshard.cli.main", *plan_argv(gpt, tmp_path)], 0.2,
                                 wait_for=None)
    assert (code, err) == (130, "autoshard: interrupted\n")
