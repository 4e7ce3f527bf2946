"""A plan document is a contract (`autoshard.planning.plan_contract.read_plan`): a hand-edited plan
that no longer fits its graph and mesh is refused by `emit`, `simulate`, `estimate` and
`/v1/estimate` alike (exit 2 / HTTP 422), each problem named by its JSON pointer, and nothing is
emitted, simulated or priced."""

from __future__ import annotations

import copy
import functools
import json
import random
from pathlib import Path

import pytest

import autoshard
from autoshard.cli.main import main
from autoshard.errors import InputError
from autoshard.graph.schema import load_graph, read_json
from autoshard.mesh import Mesh
from autoshard.planning.hardware import bind_hardware
from autoshard.planning.plan import plan_from_json, plan_to_json
from autoshard.planning.report import estimate
from support.service import error_of

MLP = str(Path(__file__).parent.parent / "examples" / "mlp.json")
MESH = Mesh.parse("dp=2,tp=4")


def megatron_document() -> dict:
    """A whole plan document with reshardings: fc2 row-split leaves a partial sum that layer1 reads
    reduced, and tp-split weights are gathered."""
    graph = load_graph(MLP, MESH)
    plan = plan_from_json({"ops": {"layer0.fc1": {"option": [["dp"], ["tp"], []]},
                                   "layer0.act": {"option": [["dp"], ["tp"]]},
                                   "layer0.fc2": {"option": [["dp"], [], ["tp"]]}},
                           "tensors": {"x": [["dp"]], "layer0.w1": [[], ["tp"]], "layer0.w2": [["tp"]]}}, graph, MESH)
    document = plan_to_json(plan)
    document["reshardings"] = estimate(plan, bind_hardware("dgx-h100", MESH)).to_json()["reshardings"]
    return document


DOCUMENT = megatron_document()


def _rename(section: str, old: str, new: str):
    def edit(d: dict) -> None:
        d[section][new] = d[section].pop(old)
    return edit


def _set(*path_and_value):
    *path, value = path_and_value

    def edit(d: dict) -> None:
        node = d
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return edit


def _delete(*path):
    def edit(d: dict) -> None:
        node = d
        for key in path[:-1]:
            node = node[key]
        del node[path[-1]]
    return edit


def _both(entry_key: tuple, step_key: tuple, sharding: dict):
    """Set one end of resharding 0 and the matching end of its steps, so only the end is wrong."""
    def edit(d: dict) -> None:
        entry = d["reshardings"][0]
        entry[entry_key[0]] = sharding
        entry["steps"][step_key[0]][step_key[1]] = sharding
    return edit


# Each class of hand edit the contract refuses, with the pointers its answer must name.
EDITS = {
    "op missing": (_delete("ops", "layer1.act"), ["/ops/layer1.act"]),
    "op unknown": (_set("ops", "attention", {"kind": "attention", "option": [[]]}), ["/ops/attention"]),
    "op kind changed": (_set("ops", "layer0.act", "kind", "relu"), ["/ops/layer0.act/kind"]),
    "op option of another loop count": (_set("ops", "layer0.fc1", "option", [["dp"], ["tp"]]), ["/ops/layer0.fc1"]),
    "tensor missing": (_delete("tensors", "layer0.w2"), ["/tensors/layer0.w2"]),
    "tensor misspelled": (_rename("tensors", "layer0.w2", "layer0.W2"), ["/tensors/layer0.W2", "/tensors/layer0.w2"]),
    "tensors null": (_set("tensors", None), ["/tensors"]),
    "tensor sharding too long for its shape": (_set("tensors", "x", [["dp"], [], ["tp"]]), ["/tensors/x"]),
    "format missing": (_delete("format"), ["/format"]),
    "format wrong": (_set("format", "autoshard.plan/v2"), ["/format"]),
    "unknown key": (_set("extra", 1), ["/extra"]),
    "unknown key in an op": (_set("ops", "layer0.fc1", "optoin", []), ["/ops/layer0.fc1/optoin"]),
    "resharding step of no known kind": (_set("reshardings", 0, "steps", 0, "kind", "teleport"),
                                         ["/reshardings/0/steps/0/kind"]),
    "resharding steps not a list": (_set("reshardings", 0, "steps", "all_reduce"), ["/reshardings/0/steps"]),
    "resharding steps over no mesh axis": (_set("reshardings", 0, "steps", 0, "mesh_axes", ["pp"]),
                                           ["/reshardings/0/steps/0/mesh_axes"]),
    "resharding reaching the wrong target": (_set("reshardings", 0, "to", {"split_axes": [[], ["dp"]]}),
                                             ["/reshardings/0"]),
    "resharding from where the value is not": (_set("reshardings", 0, "from", {"split_axes": [["tp"]]}),
                                               ["/reshardings/0"]),
    "resharding whose steps agree on the wrong target": (_both(("to",), (-1, "after"), {"split_axes": [[], ["dp"]]}),
                                                         ["/reshardings/0/to"]),
    "resharding whose steps agree on the wrong source": (_both(("from",), (0, "before"), {"split_axes": [["tp"]]}),
                                                         ["/reshardings/0/from"]),
    "microbatches not a count": (_set("microbatches", 0), ["/microbatches"]),
    "topology not a name": (_set("topology", ["dgx-h100"]), ["/topology"]),
    "topology nodes not a count": (_set("topology_options", {"nodes": "x"}), ["/topology_options/nodes"]),
    "topology option unknown": (_set("topology_options", {"node": 2}), ["/topology_options/node"]),
    "resharding of an unknown tensor": (_set("reshardings", 0, "tensor", "nope"), ["/reshardings/0/tensor"]),
}


def edited(name: str) -> dict:
    document = copy.deepcopy(DOCUMENT)
    EDITS[name][0](document)
    return document


def test_the_unedited_document_is_read_back_as_its_plan():
    plan = autoshard.read_plan(DOCUMENT, load_graph(MLP, MESH), MESH)
    assert plan_to_json(plan) == {k: v for k, v in DOCUMENT.items() if k != "reshardings"}


@pytest.mark.parametrize("name", EDITS)
def test_the_python_reader_names_each_edit(name):
    with pytest.raises(InputError) as error:
        autoshard.read_plan(edited(name), load_graph(MLP, MESH), MESH)
    found = [p.where for p in error.value.problems]
    assert all(any(w.startswith(where) for w in found) for where in EDITS[name][1]), found


@pytest.mark.parametrize("command", [["emit", "--stage", "partitioned"], ["simulate"],
                                     ["estimate", "--topology", "dgx-h100"]])
@pytest.mark.parametrize("name", EDITS)
def test_the_cli_refuses_each_edit_with_exit_2_naming_it(tmp_path, capsys, command, name):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(edited(name)))
    assert main([command[0], MLP, "--mesh", str(MESH), "--plan", str(path), *command[1:]]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # no IR, no verdict, no price
    assert all(f"{where}" in captured.err for where in EDITS[name][1]), captured.err


@pytest.mark.parametrize("name", EDITS)
def test_v1_estimate_refuses_each_edit_with_422_naming_it(http, name):
    body = {"graph": read_json(MLP), "mesh": str(MESH), "topology": "dgx-h100", "plan": edited(name)}
    response = http.post("/v1/estimate", json=body)
    assert response.status_code == 422
    found = [p["where"] for p in error_of(response)["problems"]]
    assert all(any(w.startswith("/plan" + where) for w in found) for where in EDITS[name][1]), found


def test_a_plan_for_a_larger_mesh_is_refused_everywhere(tmp_path, capsys, http):
    larger = copy.deepcopy(DOCUMENT)
    larger["mesh"]["axes"][0]["size"] = 4
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(larger))
    for command in (["emit"], ["simulate"], ["estimate", "--topology", "dgx-h100"]):
        assert main([command[0], MLP, "--mesh", str(MESH), "--plan", str(path), *command[1:]]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and "made for mesh dp=4,tp=4, not dp=2,tp=4" in captured.err
    response = http.post("/v1/estimate", json={"graph": read_json(MLP), "mesh": str(MESH), "plan": larger})
    assert response.status_code == 422
    assert [p["where"] for p in error_of(response)["problems"]] == ["/plan/mesh"]
    with pytest.raises(InputError) as error:
        autoshard.read_plan(larger, load_graph(MLP, MESH), MESH)
    assert [p.where for p in error.value.problems] == ["/mesh"]


@pytest.mark.parametrize("mesh, where", [
    ({"axes": [{"name": "dp", "size": "2"}, {"name": "tp", "size": 4}]}, "/mesh/axes/0/size"),
    ({"axes": [{"name": ["dp"], "size": 2}, {"name": "tp", "size": 4}]}, "/mesh/axes/0/name"),
    ({"axes": [{"name": "dp", "size": 2, "links": 1}, {"name": "tp", "size": 4}]}, "/mesh/axes/0/links"),
    ({"axes": "dp=2,tp=4"}, "/mesh"),
    (None, "/mesh"),
])
def test_a_malformed_mesh_is_named(tmp_path, capsys, mesh, where):
    with pytest.raises(InputError) as error:
        autoshard.read_plan(DOCUMENT | {"mesh": mesh}, load_graph(MLP, MESH), MESH)
    assert where in [p.where for p in error.value.problems]
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(DOCUMENT | {"mesh": mesh}))
    for flags in ([], ["--mesh", str(MESH)]):  # the plan's mesh stands, or is checked against --mesh
        assert main(["emit", MLP, "--plan", str(path), *flags]) == 2
        assert f"{where}: " in capsys.readouterr().err


def test_every_problem_is_named_at_once():
    document = edited("op kind changed")
    for name in ("tensor missing", "unknown key"):
        EDITS[name][0](document)
    with pytest.raises(InputError) as error:
        autoshard.read_plan(document, load_graph(MLP, MESH), MESH)
    assert {"/ops/layer0.act/kind", "/tensors/layer0.w2", "/extra"} <= {p.where for p in error.value.problems}


ODD_VALUES = [None, 0, -1, 1.5, "x", "", [], {}, [[]], [["dp"]], [["nope"]], {"split_axes": 3}, True, 10 ** 50,
              {"split_axes": [["tp"]], "partial": {"kind": "sum", "axes": ["dp"]}}, {"kind": "matmul"}, [1, 2],
              "output", [["dp"], ["dp"]]]


def _pointers(node, path=()):
    yield path
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in children:
        yield from _pointers(child, path + (key,))


def test_any_value_anywhere_is_an_input_error_or_a_plan():
    """Random hand edits (values of every JSON type put anywhere, keys dropped) never raise
    anything but an InputError: no TypeError from an unhashable or misplaced value."""
    rng = random.Random(0)
    where = [p for p in _pointers(DOCUMENT) if p]
    graph = load_graph(MLP, MESH)
    for _ in range(200):
        document = copy.deepcopy(DOCUMENT)
        for path in rng.sample(where, 2):
            try:
                node = functools.reduce(lambda n, k: n[k], path[:-1], document)
                if isinstance(node, dict) and rng.random() < 0.2:
                    del node[path[-1]]
                else:
                    node[path[-1]] = copy.deepcopy(rng.choice(ODD_VALUES))
            except (KeyError, IndexError, TypeError):
                pass  # an earlier edit replaced the path's parent
        try:
            autoshard.read_plan(document, graph, MESH)
        except InputError as error:
            assert error.problems
