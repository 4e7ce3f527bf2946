"""The graph format: a valid document loads; every class of bad input is reported, all at once."""

from __future__ import annotations

import copy
import json

import pytest

from autoshard.cli.main import main
from autoshard.errors import InputError
from autoshard.graph.model import live_ranges, to_networkx, topological_order
from autoshard.graph.schema import graph_from_json, graph_to_json, load_graph
from autoshard.mesh import Mesh

GOOD = {
    "format": "autoshard.graph/v1", "name": "mlp",
    "tensors": {"x": {"shape": [64, 1024], "dtype": "bf16", "role": "input"},
                "w1": {"shape": [1024, 4096], "dtype": "bf16", "role": "parameter"},
                "h": {"shape": [64, 4096], "dtype": "bf16"},
                "s": {"shape": [64], "dtype": "f32"}},
    "ops": [{"name": "fc1", "kind": "matmul", "inputs": ["x", "w1"], "outputs": ["h"]},
            {"name": "r", "kind": "generic", "inputs": ["h"], "outputs": ["s"],
             "iterator_types": ["parallel", "reduction"],
             "indexing_maps": ["(d0, d1) -> (d0, d1)", "(d0, d1) -> (d0)"], "payload": "add"}],
    "outputs": ["s"],
    "constraints": [{"tensor": "x", "split_axes": [["dp"], []], "required": True}],
}


def problems_of(doc, mesh=None) -> list[str]:
    with pytest.raises(InputError) as info:
        graph_from_json(doc, mesh)
    return [str(p) for p in info.value.problems]


def edited(**changes):
    doc = copy.deepcopy(GOOD)
    for path, value in changes.items():
        target = doc
        keys = path.split("__")
        for k in keys[:-1]:
            target = target[int(k)] if isinstance(target, list) else target[k]
        last = keys[-1]
        if isinstance(target, list):
            target[int(last)] = value
        else:
            target[last] = value
    return doc


def test_good_document_loads_with_loops_and_order():
    graph = graph_from_json(GOOD, Mesh.parse("dp=2,tp=4"))
    fc1 = graph.op_by_name["fc1"]
    assert fc1.nest.extents == (64, 4096, 1024)
    assert fc1.nest.iterator_types == ("parallel", "parallel", "reduction")
    assert [str(m) for m in fc1.nest.maps] == ["(d0, d1, d2) -> (d0, d2)", "(d0, d1, d2) -> (d2, d1)", "(d0, d1, d2) -> (d0, d1)"]
    assert [op.name for op in topological_order(graph)] == ["fc1", "r"]
    assert live_ranges(graph) == {"x": (0, 0), "w1": (0, 1), "h": (0, 1), "s": (1, 1)}
    view = to_networkx(graph)
    assert view.edges["fc1", "r", "h"]["bytes"] == 64 * 4096 * 2
    assert graph.constraints[0].sharding.split_axes == (("dp",),)


def test_round_trip_through_json():
    graph = graph_from_json(GOOD)
    again = graph_from_json(json.loads(json.dumps(graph_to_json(graph))))
    assert again.ops == graph.ops and again.tensors == graph.tensors and again.constraints == graph.constraints


@pytest.mark.parametrize("doc, where, words", [
    (edited(ops__0__kind="matmool"), "/ops/0/kind", "unknown op kind 'matmool'"),
    (edited(ops__0__inputs=["x", "w9"]), "/ops/0/inputs/1", "unknown tensor 'w9'"),
    (edited(ops__1__outputs=["h"]), "/ops/1/outputs/0", "already produced by op 'fc1'"),
    (edited(ops__0__inputs=["x"]), "/ops/0/inputs", "takes 2 input(s), got 1"),
    (edited(tensors__h={"shape": [64, 4000], "dtype": "bf16"}), "/tensors/h/shape", "produces shape [64, 4096]"),
    (edited(tensors__x={"shape": [64, 1024.5], "dtype": "bf16", "role": "input"}), "/tensors/x/shape/1", "integer"),
    (edited(tensors__x={"shape": [64, -3], "dtype": "bf16", "role": "input"}), "/tensors/x/shape/1", "positive"),
    (edited(tensors__x={"shape": [64, 1024], "dtype": "bf15", "role": "input"}), "/tensors/x/dtype", "unknown dtype 'bf15'"),
    (edited(ops__1__indexing_maps=["(d0, d1) -> (d0, d1", "(d0, d1) -> (d0)"]), "/ops/1/indexing_maps/0", "cannot parse affine map"),
    (edited(ops__1__indexing_maps=["(d0, d1) -> (d0)", "(d0, d1) -> (d0)"]), "/ops/1/indexing_maps/0", "1 results but operand 0 has rank 2"),
    (edited(ops__1__iterator_types=["parallel"]), "/ops/1/indexing_maps/0", "2 loops but there are 1 iterator types"),
    (edited(constraints=[{"tensor": "x", "split_axes": [["dp"], ["dp"]]}]), "/constraints/0/split_axes", "used twice"),
    (edited(constraints=[{"tensor": "x", "split_axes": [["pp"]]}]), "/constraints/0/split_axes", "unknown mesh axis 'pp'"),
    (edited(constraints=[{"tensor": "x", "split_axes": [[], [], ["dp"]]}]), "/constraints/0/split_axes", "rank 2"),
    (edited(constraints=[{"tensor": "y", "split_axes": []}]), "/constraints/0/tensor", "unknown tensor 'y'"),
    (edited(format="autoshard.graph/v0"), "/format", "autoshard.graph/v1"),
    (edited(ops__0__perm=[1, 0]), "/ops/0/perm", "takes no attribute 'perm'"),
    (edited(tensors__q={"shape": [2], "dtype": "f32"}), "/tensors/q/role", "produced by no op"),
    (edited(ops__0__outputs=["x"]), "/ops/0/outputs/0", "role 'input'"),
    (edited(ops__1__payload="frobnicate"), "/ops/1/payload", "unknown payload"),
])
def test_each_bad_input_names_the_field(doc, where, words):
    problems = problems_of(doc, Mesh.parse("dp=2,tp=4"))
    assert any(p.startswith(where) and words in p for p in problems), problems


def test_cycle_is_reported_with_its_ops():
    doc = {
        "format": "autoshard.graph/v1",
        "tensors": {"a": {"shape": [4], "dtype": "f32"}, "b": {"shape": [4], "dtype": "f32"}},
        "ops": [{"name": "f", "kind": "exp", "inputs": ["b"], "outputs": ["a"]},
                {"name": "g", "kind": "exp", "inputs": ["a"], "outputs": ["b"]}],
    }
    (problem,) = problems_of(doc)
    assert problem.startswith("/ops") and "cycle" in problem and "f" in problem and "g" in problem


def test_a_cycle_is_named_in_data_flow_order_apart_from_the_ops_around_it():
    four = {"shape": [4], "dtype": "f32"}
    doc = {"format": "autoshard.graph/v1", "tensors": {**{t: four for t in "abcde"}, "x": {**four, "role": "input"}},
           "ops": [{"name": "tail", "kind": "exp", "inputs": ["c"], "outputs": ["e"]},
                   {"name": "f", "kind": "add", "inputs": ["x", "c"], "outputs": ["a"]},
                   {"name": "g", "kind": "exp", "inputs": ["a"], "outputs": ["b"]},
                   {"name": "h", "kind": "exp", "inputs": ["b"], "outputs": ["c"]},
                   {"name": "side", "kind": "exp", "inputs": ["x"], "outputs": ["d"]}]}
    (problem,) = problems_of(doc)
    cycle = problem.split("cycle: ")[1].split(" -> ")
    assert cycle[0] == cycle[-1] and len(cycle) == 4 and set(cycle) == {"f", "g", "h"}
    follows = {"f": "g", "g": "h", "h": "f"}  # who reads what each makes
    assert all(follows[u] == v for u, v in zip(cycle, cycle[1:]))


def test_all_problems_are_reported_at_once():
    doc = edited(ops__0__kind="nope", tensors__x={"shape": [64, 1024], "dtype": "bf99", "role": "input"},
                 constraints=[{"tensor": "zz", "split_axes": []}])
    problems = problems_of(doc)
    assert len(problems) >= 3
    assert {p.split(":")[0] for p in problems} >= {"/ops/0/kind", "/tensors/x/dtype", "/constraints/0/tensor"}


def test_not_json_and_missing_file(tmp_path, capsys):
    bad = tmp_path / "g.json"
    bad.write_text("{not json")
    assert main(["validate", str(bad)]) == 2
    assert "not JSON" in capsys.readouterr().err
    assert main(["validate", str(tmp_path / "missing.json")]) == 2
    assert "cannot read file" in capsys.readouterr().err


def test_validate_cli_summary_and_exit_codes(tmp_path, capsys):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(GOOD))
    assert main(["validate", str(good), "--mesh", "dp=2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ok: mlp: 2 ops, 4 tensors") and "537 MFLOP" in out
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(edited(ops__0__kind="conv4d")))
    assert main(["validate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "/ops/0/kind" in err and "Traceback" not in err


def test_show_lists_loops_flops_and_bytes(tmp_path, capsys):
    path = tmp_path / "g.json"
    path.write_text(json.dumps(GOOD))
    assert main(["show", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    fc1 = next(line for line in lines if line.startswith("fc1"))
    assert "64p 4096p 1024r" in fc1 and "537 M" in fc1


def test_load_graph_reads_files(tmp_path):
    path = tmp_path / "g.json"
    path.write_text(json.dumps(GOOD))
    assert load_graph(path).name == "mlp"


def test_two_required_shardings_of_one_tensor_are_refused_naming_both():
    doc = edited(constraints=[{"tensor": "w1", "split_axes": [["tp"]]}, {"tensor": "w1", "split_axes": [[], ["tp"]],
                                                                        "required": False},
                              {"tensor": "w1", "split_axes": [[], ["tp"]]}])
    (problem,) = problems_of(doc)
    assert problem.startswith("/constraints/2") and "/constraints/0" in problem and "'w1'" in problem


@pytest.mark.parametrize("name", ["x\ny", "tab\there", ""])
def test_names_with_control_characters_are_refused(name):
    doc = edited()
    doc["tensors"][name] = {"shape": [4], "dtype": "f32", "role": "input"}
    assert any("control characters" in p for p in problems_of(doc))


def test_a_tensor_beyond_a_petabyte_is_refused_before_any_byte_count_can_overflow():
    doc = edited()
    doc["tensors"]["x"]["shape"] = [10 ** 30, doc["tensors"]["x"]["shape"][1]]
    problems = problems_of(doc)
    assert any(p.startswith("/tensors/x/shape") and "over the limit of 2**50 (1 PiB)" in p for p in problems)


def test_a_generic_map_reading_past_its_operand_is_refused_by_validate():
    doc = edited(ops__1__indexing_maps=["(d0, d1) -> (d0 + 1, d1)", "(d0, d1) -> (d0)"])
    (problem,) = problems_of(doc)
    assert problem.startswith("/ops/1/indexing_maps/0") and "map 0 reads indices 1..64 of dim 0, which has size 64" in problem
