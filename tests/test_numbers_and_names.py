"""Numbers in ASCII digits and finite, repeated and empty values refused, names UTF-8 can encode:
each refused at the door (exit 2 or 422) naming the flag or pointer, never a crash or a stored job."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoshard.cli.main import main
from autoshard.errors import InputError
from autoshard.graph.schema import graph_from_json
from autoshard.numerals import parse_finite, parse_integer
from support.service import MLP, error_of

SUPERSCRIPT_TWO = "\u00b2"
ARABIC_INDIC_THREE = "\u0663"  # int() reads it as 3
LONE_SURROGATE = "\ud800"


def refused(capsys, argv: list[str]) -> str:
    """Run the CLI, expect exit 2 (returned, or argparse's exit for a flag's type) with no traceback;
    return stderr."""
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    assert code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err
    return err


@pytest.mark.parametrize("digit, name", [(SUPERSCRIPT_TWO, "SUPERSCRIPT TWO"),
                                         (ARABIC_INDIC_THREE, "ARABIC-INDIC DIGIT THREE")])
def test_a_number_in_other_digits_is_refused_naming_the_character(digit, name):
    with pytest.raises(InputError) as error:
        parse_integer(f"1{digit}", "--x")
    assert error.value.problems[0].where == "--x" and name in str(error.value) and "ASCII" in str(error.value)


@pytest.mark.parametrize("text", ["nan", "inf", "-Infinity", "1e400"])
def test_a_number_that_is_not_finite_is_refused(text):
    with pytest.raises(InputError, match="finite|beyond the range"):
        parse_finite(text, "--x")


@pytest.mark.parametrize("argv, flag", [
    (["validate", "examples/mlp.json", "--mesh", f"x={SUPERSCRIPT_TWO}"], "--mesh x"),
    (["validate", "examples/mlp.json", "--mesh", f"x={ARABIC_INDIC_THREE}"], "--mesh x"),
    (["reshard", "--mesh", "x=2", "--shape", f"6x{SUPERSCRIPT_TWO}", "--from", "{}", "--to", "{}"], "--shape"),
    (["plan", "examples/mlp.json", "--mesh", "x=2", "--slice", f"2x{SUPERSCRIPT_TWO}"], "--slice"),
    (["plan", "examples/mlp.json", "--mesh", "x=2", "--weights", f"time={ARABIC_INDIC_THREE}"], "--weights"),
    (["collective", "all_reduce", "--mesh", "x=2", "--bytes", f"{ARABIC_INDIC_THREE}MiB"], "--bytes"),
])
def test_cli_sizes_in_other_digits_exit_2_naming_the_flag_and_character(capsys, argv, flag):
    err = refused(capsys, argv)
    assert f"{flag}: " in err and "is not an ASCII character" in err


@pytest.mark.parametrize("argv, flag", [
    (["plan", "examples/mlp.json", "--mesh", "x=2", "--seed", ARABIC_INDIC_THREE], "--seed"),
    (["plan", "examples/mlp.json", "--mesh", "x=2", "--time-limit", f"1{ARABIC_INDIC_THREE}"], "--time-limit"),
    (["search", "examples/mlp.json", "--devices", f"{SUPERSCRIPT_TWO}"], "--devices"),
])
def test_numeric_flags_take_ascii_digits_only(capsys, argv, flag):
    err = refused(capsys, argv)
    assert f"argument {flag}: " in err and "is not an ASCII character" in err


@pytest.mark.parametrize("argv", [
    ["plan", "examples/mlp.json", "--mesh", "x=2", "--time-limit", "nan"],
    ["iopddl", "tests/data/iopddl_example.json", "--time-limit", "nan"],
    ["iopddl", "tests/data/iopddl_example.json", "--time-limit", "inf"],
])
def test_a_time_limit_that_is_not_finite_is_refused(capsys, argv):
    assert "--time-limit: must be a positive number of seconds" in refused(capsys, argv)


def test_a_capacity_factor_that_is_not_finite_is_refused(tmp_path, capsys):
    err = refused(capsys, ["generate", "moe", "-o", str(tmp_path / "moe.json"), "--capacity-factor", "inf"])
    assert "--capacity-factor: must be a positive number, got inf" in err


@pytest.mark.parametrize("argv, flag, words", [
    (["plan", "examples/mlp.json", "--mesh", "x=2", "--weights", "time=1,time=2"], "--weights", "given twice"),
    (["collective", "all_reduce", "--mesh", "x=2", "--bytes", "1e400"], "--bytes", "beyond the range"),
    (["collective", "all_reduce", "--mesh", "x=2", "--bytes", "1e300TB"], "--bytes", "beyond the range"),
    (["collective", "all_reduce", "--mesh", "x=2", "--bytes", "1MiB", "--axes", ""], "--axes", "expected distinct"),
    (["collective", "all_reduce", "--mesh", "x=2,y=2", "--bytes", "1MiB", "--axes", "x,"], "--axes",
     "expected distinct"),
])
def test_repeated_infinite_and_empty_values_are_refused(capsys, argv, flag, words):
    err = refused(capsys, argv)
    assert f"{flag}: " in err and words in err


def test_an_iopddl_file_with_negative_costs_or_reversed_intervals_is_refused(tmp_path, capsys):
    path = tmp_path / "instance.json"
    path.write_text(json.dumps({"problem": {
        "nodes": {"costs": [[-1, 2], [3]], "usages": [[1, 1], [1]], "intervals": [[5, 2], [0, 1]]},
        "edges": {"nodes": [[0, 1]], "costs": [[1, -2]]}, "usage_limit": 10}}))
    err = refused(capsys, ["iopddl", str(path)])
    assert "/nodes/costs/0: costs must be >= 0" in err
    assert "/nodes/intervals/0: ends before it starts: [5, 2]" in err
    assert "/edges/costs/0: costs must be >= 0" in err


def test_a_graph_name_utf8_cannot_encode_is_refused_by_the_cli(tmp_path, capsys):
    path = tmp_path / "graph.json"
    path.write_text(json.dumps(MLP | {"name": LONE_SURROGATE}))  # json.dumps writes the \ud800 escape
    err = refused(capsys, ["validate", str(path)])
    assert "/name: \\ud800 at character 0 is a lone surrogate" in err


def test_the_python_api_refuses_a_tensor_name_utf8_cannot_encode():
    document = json.loads(json.dumps(MLP))
    document["tensors"][f"x{LONE_SURROGATE}"] = document["tensors"].pop("x")
    with pytest.raises(InputError) as error:
        graph_from_json(document)
    assert error.value.problems[0].where == "/tensors/x\\ud800"


def surrogate_body(**fields) -> bytes:
    return json.dumps({"graph": MLP | {"name": LONE_SURROGATE}, "mesh": "dp=2"} | fields).encode()


@pytest.mark.parametrize("route, fields", [("/v1/plans", {}), ("/v1/validate", {}), ("/v1/estimate", {"plan": {}})])
def test_rest_refuses_a_name_utf8_cannot_encode_and_stores_no_job(http, route, fields):
    response = http.post(route, content=surrogate_body(**fields), headers={"content-type": "application/json"})
    assert response.status_code == 422
    (problem,) = error_of(response)["problems"]
    assert problem["where"] == "/graph/name" and "lone surrogate" in problem["message"]
    assert http.app.state.store.counts() == {}


@pytest.mark.parametrize("mesh, where", [
    (f"dp={SUPERSCRIPT_TWO}", "/mesh/dp"),
    (f"dp={ARABIC_INDIC_THREE}", "/mesh/dp"),
    ({"axes": [{"name": "dp", "size": ARABIC_INDIC_THREE}]}, "/mesh/axes/0/size"),
])
@pytest.mark.parametrize("route", ["/v1/plans", "/v1/estimate", "/v1/validate"])
def test_rest_meshes_in_other_digits_are_422_naming_the_axis(http, route, mesh, where):
    body = {"graph": MLP, "mesh": mesh} | ({"plan": {}} if route == "/v1/estimate" else {})
    response = http.post(route, json=body)
    assert response.status_code == 422
    assert any(p["where"] == where for p in error_of(response)["problems"])


def test_rest_slice_in_other_digits_is_422(http):
    response = http.post("/v1/plans", json={"graph": MLP, "mesh": "dp=2", "topology": "tpu-v5p",
                                            "topology_options": {"slice": f"2x{SUPERSCRIPT_TWO}"}})
    assert response.status_code == 422
    problems = error_of(response)["problems"]
    assert any(p["where"] == "/topology_options/slice" and "ASCII" in p["message"] for p in problems)


def test_examples_still_read(capsys):
    assert main(["validate", str(Path("examples") / "mlp.json"), "--mesh", "dp=2,tp=4"]) == 0


@pytest.mark.parametrize("options, where", [
    ({"time_limit_s": "Infinity"}, "/options/time_limit_s"),
    ({"gap_limit": "NaN"}, "/options/gap_limit"),
    ({"weights": {"time": "Infinity"}}, "/options/weights/time"),
    ({"memory_budget_bytes": "1e999"}, "/options/memory_budget_bytes"),
])
def test_rest_options_that_are_not_finite_are_422_at_their_pointer(http, options, where):
    # Python's JSON reader takes NaN, Infinity and 1e999 (as infinity) from a body
    body = json.dumps({"graph": MLP, "mesh": "dp=2", "options": options})
    for spelling in ("Infinity", "NaN", "1e999"):
        body = body.replace(f'"{spelling}"', spelling)
    response = http.post("/v1/plans", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 422
    assert [(p["where"], p["message"]) for p in error_of(response)["problems"]] == [
        (where, "Input should be a finite number")]
