"""`validate` is a promise: what it accepts, `plan`, `emit`, `simulate` and the service accept too.
So it refuses, naming the field and tensor, what used to pass it and break later: attributes of
the wrong type (a string `"no"` is not false), payloads on dtypes they have no meaning on, pins
a tensor cannot hold, and integer literals too long to mean anything."""

from __future__ import annotations

import copy
import json

import pytest

from autoshard.cli.main import main
from autoshard.mlir import scalar
from autoshard.ops.payloads import PAYLOADS
from support.service import MLP, error_of


def graph(tensors: dict, ops: list, **extra) -> dict:
    return {"format": "autoshard.graph/v1", "name": "g", "tensors": tensors, "ops": ops, **extra}


F32 = {"shape": [2, 4, 8, 16], "dtype": "f32"}
ATTENTION = graph({"q": F32 | {"role": "input"}, "k": F32 | {"role": "input"}, "v": F32 | {"role": "input"}, "o": F32},
                  [{"name": "sdpa", "kind": "attention", "inputs": ["q", "k", "v"], "outputs": ["o"]}])
ROWS = graph({"x": {"shape": [4, 8], "dtype": "f32", "role": "input"}, "y": {"shape": [4, 8], "dtype": "f32"},
              "z": {"shape": [4, 8], "dtype": "f32"}, "s": {"shape": [4, 1], "dtype": "f32"}},
             [{"name": "soft", "kind": "softmax", "inputs": ["x"], "outputs": ["y"]},
              {"name": "norm", "kind": "layer_norm", "inputs": ["y"], "outputs": ["z"]},
              {"name": "total", "kind": "reduce_sum", "inputs": ["z"], "outputs": ["s"], "dims": [1], "keepdims": True}])


def with_attr(document: dict, op: int, name: str, value, nested: bool = False) -> dict:
    edited = copy.deepcopy(document)
    if nested:
        edited["ops"][op].pop(name, None)
    (edited["ops"][op].setdefault("attrs", {}) if nested else edited["ops"][op])[name] = value
    return edited


def validate(tmp_path, capsys, document) -> tuple[int, str]:
    path = tmp_path / "graph.json"
    path.write_text(json.dumps(document) if isinstance(document, dict) else document)
    code = main(["validate", str(path)])
    return code, capsys.readouterr().err


WRONG_ATTRIBUTES = [
    (ATTENTION, 0, "causal", "no", "true or false"),  # truthy: it silently masked
    (ATTENTION, 0, "scale", "x", "a finite number"),
    (ATTENTION, 0, "scale", "0.1", "a finite number"),
    (ROWS, 0, "axis", 1.0, "an integer"),  # numpy would index with a float after solving
    (ROWS, 1, "eps", "small", "a positive finite number"),
    (ROWS, 1, "eps", "1e-5", "a positive finite number"),
    (ROWS, 1, "eps", 0, "a positive finite number"),
    (ROWS, 2, "keepdims", "yes", "true or false"),
]


@pytest.mark.parametrize("document, op, name, value, expected", WRONG_ATTRIBUTES)
@pytest.mark.parametrize("nested", [False, True])
def test_an_attribute_of_the_wrong_type_is_refused_naming_its_pointer(tmp_path, capsys, document, op, name, value,
                                                                      expected, nested):
    code, err = validate(tmp_path, capsys, with_attr(document, op, name, value, nested))
    where = f"/ops/{op}/attrs/{name}" if nested else f"/ops/{op}/{name}"
    assert code == 2 and f"{where}: " in err and f"must be {expected}, got {value!r}" in err


def test_an_attribute_given_twice_is_refused(tmp_path, capsys):
    twice = copy.deepcopy(ROWS)
    twice["ops"][2]["attrs"] = {"keepdims": False}  # and True at the top level, which used to win silently
    code, err = validate(tmp_path, capsys, twice)
    assert code == 2 and "/ops/2/attrs/keepdims: " in err and "given both here and at the top level" in err


def test_attributes_of_the_right_type_pass(tmp_path, capsys):
    for document in (with_attr(with_attr(ATTENTION, 0, "causal", False), 0, "scale", 0.25),
                     with_attr(with_attr(ROWS, 0, "axis", -1), 1, "eps", 1e-5)):
        assert validate(tmp_path, capsys, document)[0] == 0


def test_a_gradient_checks_its_forward_attributes_too(tmp_path, capsys):
    document = copy.deepcopy(ATTENTION)
    document["tensors"] |= {"dy": F32 | {"role": "input"}, "dq": F32}
    document["ops"].append({"name": "dsdpa", "kind": "grad", "inputs": ["q", "k", "v", "dy"], "outputs": ["dq"],
                            "of": "attention", "wrt": 0, "forward": {"causal": "no"}})
    code, err = validate(tmp_path, capsys, document)
    assert code == 2 and "/ops/1/forward/causal: " in err and "must be true or false" in err


def test_the_service_refuses_what_validate_refuses(http):
    response = http.post("/v1/validate", json={"graph": with_attr(ATTENTION, 0, "causal", "no")})
    assert response.status_code == 422
    assert [p["where"] for p in error_of(response)["problems"]] == ["/graph/ops/0/causal"]


BOOLS = graph({"b": {"shape": [4, 8], "dtype": "bool", "role": "input"}, "y": {"shape": [4, 8], "dtype": "bool"}},
              [{"name": "act", "kind": "gelu", "inputs": ["b"], "outputs": ["y"]}])


def test_a_payload_on_a_dtype_it_has_no_meaning_on_is_refused_naming_the_tensor(tmp_path, capsys):
    """A bool into gelu used to pass validate and plan and fail only when emitting IR."""
    code, err = validate(tmp_path, capsys, BOOLS)
    assert code == 2 and "/ops/0/inputs/0: " in err and "'b' of dtype bool" in err and "'gelu'" in err
    logical = copy.deepcopy(BOOLS)
    logical["ops"][0] |= {"kind": "max", "inputs": ["b", "b"]}
    assert validate(tmp_path, capsys, logical)[0] == 0


def test_a_float_only_kind_on_integers_is_refused(tmp_path, capsys):
    document = copy.deepcopy(ROWS)
    document["tensors"]["x"]["dtype"] = "i32"
    code, err = validate(tmp_path, capsys, document)
    assert code == 2 and "/ops/0/inputs/0: " in err and "'x' of dtype i32" in err and "floating-point" in err


def test_the_payloads_on_bool_are_those_the_ir_lowers_on_i1():
    assert {name for name, p in PAYLOADS.items() if p.on_bool} == set(scalar._LOGICAL)


def pinned(tensor: str, kind: str) -> dict:
    document = json.loads(json.dumps(MLP))
    document["constraints"] = [{"tensor": tensor, "split_axes": [], "partial": {"kind": kind, "axes": ["dp"]}}]
    return document


@pytest.mark.parametrize("tensor, kind, words", [
    ("x", "sum", "input 'x' is stored whole or split"),
    ("w1", "max", "parameter 'w1' is stored whole or split"),
    ("y", "sum", "graph output 'y' cannot be pinned sum-partial"),
    ("y", "product", "graph output 'y' cannot be pinned product-partial"),
])
def test_a_pin_the_tensor_cannot_hold_is_refused_naming_the_constraint(tmp_path, capsys, tensor, kind, words):
    code, err = validate(tmp_path, capsys, pinned(tensor, kind))
    assert code == 2 and "/constraints/0/partial: " in err and words in err


def test_a_max_partial_output_pin_is_held_by_a_whole_value(tmp_path, capsys):
    assert validate(tmp_path, capsys, pinned("y", "max"))[0] == 0


HUGE = "9" * 5000


def test_a_huge_integer_in_a_graph_is_refused_by_the_reader_naming_it(tmp_path, capsys, http):
    text = json.dumps(MLP).replace("[8, 16]", f"[{HUGE}, 16]", 1)
    code, err = validate(tmp_path, capsys, text)
    assert code == 2 and "/tensors/x/shape/0: an integer of 5000 digits" in err and "Traceback" not in err
    response = http.post("/v1/validate", content=f'{{"graph": {text}}}', headers={"content-type": "application/json"})
    assert response.status_code == 422
    assert [p["where"] for p in error_of(response)["problems"]] == ["/graph/tensors/x/shape/0"]


def test_a_huge_integer_in_a_plan_is_refused_by_the_reader_naming_it(tmp_path, capsys):
    (tmp_path / "g.json").write_text(json.dumps(MLP))
    (tmp_path / "p.json").write_text(f'{{"format": "autoshard.plan/v1", "mesh": {{"axes": [{{"name": "dp", '
                                     f'"size": {HUGE}}}]}}, "ops": {{}}, "tensors": {{}}}}')
    for command in ("emit", "simulate"):
        assert main([command, str(tmp_path / "g.json"), "--plan", str(tmp_path / "p.json")]) == 2
        assert "/mesh/axes/0/size: an integer of 5000 digits" in capsys.readouterr().err
