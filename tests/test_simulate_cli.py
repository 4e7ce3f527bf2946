"""`autoshard simulate`: PASS with exit 0, FAIL naming op and device with exit 1, input errors exit 2."""

from __future__ import annotations

import dataclasses
import json

import pytest

from autoshard.cli.main import main
from autoshard.delivery import deliver as deliver_module
from autoshard.delivery.document import plan_document
from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.planning.hardware import bind_hardware
from autoshard.planning.make_plan import SolveSettings, make_plan
from autoshard.planning.options import ShardingOption
from autoshard.planning.plan import Plan, plan_to_json
from autoshard.sharding import Sharding
from autoshard.spmd.program import Communicate, LocalOp

GRAPH = {"format": "autoshard.graph/v1", "name": "mlp",
         "tensors": {"x": {"shape": [4, 6], "dtype": "f32", "role": "input"},
                     "w1": {"shape": [6, 5], "dtype": "f32", "role": "parameter"},
                     "w2": {"shape": [5, 3], "dtype": "f32", "role": "parameter"},
                     "h": {"shape": [4, 5], "dtype": "f32"}, "a": {"shape": [4, 5], "dtype": "f32"},
                     "y": {"shape": [4, 3], "dtype": "f32"}},
         "ops": [{"name": "fc1", "kind": "matmul", "inputs": ["x", "w1"], "outputs": ["h"]},
                 {"name": "act", "kind": "tanh", "inputs": ["h"], "outputs": ["a"]},
                 {"name": "fc2", "kind": "matmul", "inputs": ["a", "w2"], "outputs": ["y"]}],
         "outputs": ["y"]}
MESH = Mesh.of(x=2, y=2)


@pytest.fixture
def files(tmp_path):
    """The graph and a plan whose fc1 leaves a partial sum that act needs reduced."""
    graph = graph_from_json(GRAPH)
    plan = Plan(graph, MESH, {"fc1": ShardingOption(((), (), ("x",))), "act": ShardingOption(((), ())),
                              "fc2": ShardingOption((("y",), (), ()))},
                {"x": Sharding(((), ("x",))), "w1": Sharding((("x",),)), "w2": Sharding()})
    graph_path, plan_path = tmp_path / "graph.json", tmp_path / "plan.json"
    graph_path.write_text(json.dumps(GRAPH))
    plan_path.write_text(json.dumps(plan_to_json(plan)))
    return str(graph_path), str(plan_path)


def test_a_correct_plan_passes(files, capsys):
    graph, plan = files
    assert main(["simulate", graph, "--plan", plan, "--mesh", "x=2,y=2", "--seed", "4"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("PASS max error ") and out.rstrip().endswith("(seed 4)")


def test_the_mesh_defaults_to_the_plans_and_json_prints_the_verdict(files, capsys):
    graph, plan = files
    assert main(["simulate", graph, "--plan", plan, "--json", "--no-collective-opt"]) == 0
    verdict = json.loads(capsys.readouterr().out)
    assert verdict["passed"] is True and verdict["first_divergence"] is None
    assert verdict["values_checked"] == 5  # fc1, its all_reduce, act, the all_slice for fc2, fc2
    assert verdict["max_error"] < 1e-14  # float64: only the split sum's rounding
    assert main(["simulate", graph, "--plan", plan, "--json", "--declared-dtypes"]) == 0
    declared = json.loads(capsys.readouterr().out)
    assert declared["passed"] is True and 1e-9 < declared["max_error"] < 1e-5  # float32 rounding


def test_a_wrong_program_fails_at_the_op_and_device_with_exit_1(files, capsys, monkeypatch):
    partition = deliver_module.partition

    def forget_the_all_reduce(plan, price=None):
        program = partition(plan, price)
        (reduce,) = [i for i in program.body if isinstance(i, Communicate) and i.step.kind == "all_reduce"]
        body = [dataclasses.replace(i, inputs=tuple(reduce.input if v == reduce.output else v for v in i.inputs))
                if isinstance(i, LocalOp) else i for i in program.body if i is not reduce]
        return dataclasses.replace(program, body=tuple(body))

    monkeypatch.setattr(deliver_module, "partition", forget_the_all_reduce)
    graph, plan = files
    assert main(["simulate", graph, "--plan", plan, "--no-collective-opt"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("FAIL at op 'act' device [0, 0]: 'a'[0, 0] = ")


def test_a_plan_for_another_mesh_is_an_input_error(files, capsys):
    graph, plan = files
    assert main(["simulate", graph, "--plan", plan, "--mesh", "x=4"]) == 2
    assert "--mesh: the plan was made for mesh x=2,y=2, not x=4" in capsys.readouterr().err


@pytest.mark.parametrize("flags, named", [
    (["--topology", "nope"], "--topology: unknown profile 'nope'"),
    (["--topology", "dgx-h100", "--nodes", "0"], "--nodes: must be a positive integer"),
    (["--nodes", "0"], "--nodes: must be a positive integer"),
])
def test_a_wrong_hardware_flag_is_named_by_its_flag(files, capsys, flags, named):
    graph, plan = files
    assert main(["simulate", graph, "--plan", plan, "--mesh", "x=2,y=2", *flags]) == 2
    err = capsys.readouterr().err
    assert named in err and "topology/topology" not in err


def test_a_plan_without_a_mesh_is_refused_naming_it(files, capsys, tmp_path):
    """The mesh is part of the plan's contract: `--mesh` must match it, not stand in for it."""
    graph, plan = files
    document = json.loads(open(plan).read())
    del document["mesh"]
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps(document))
    for flags in ([], ["--mesh", "x=2,y=2"]):
        assert main(["simulate", graph, "--plan", str(bare), *flags]) == 2
        assert "/mesh: " in capsys.readouterr().err


def test_a_planner_plan_file_is_simulated_with_its_topology_prices(tmp_path, capsys):
    mesh = Mesh.parse("tp=4")
    graph = graph_from_json(GRAPH, mesh)
    result = make_plan(graph, mesh, bind_hardware("dgx-h100", mesh),
                       SolveSettings(time_limit_s=2, workers=1, deterministic=True, memory_budget_bytes=300))
    document = plan_document(result, "dgx-h100")
    (tmp_path / "g.json").write_text(json.dumps(GRAPH))
    (tmp_path / "p.json").write_text(json.dumps(document))
    assert main(["simulate", str(tmp_path / "g.json"), "--plan", str(tmp_path / "p.json")]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("PASS") and captured.err == ""
    # A topology that does not bind falls back to bytes-moved prices, and says so.
    document["topology"] = "no-such-profile"
    (tmp_path / "p.json").write_text(json.dumps(document))
    assert main(["simulate", str(tmp_path / "g.json"), "--plan", str(tmp_path / "p.json")]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("PASS") and "note: the plan's topology 'no-such-profile'" in captured.err


def test_a_simulation_over_the_memory_limit_is_refused(files, capsys):
    graph, plan = files
    assert main(["simulate", graph, "--plan", plan, "--max-memory", "1KiB"]) == 2
    err = capsys.readouterr().err
    assert "--max-memory: simulating graph 'mlp' on 4 devices needs about 4.63 KiB" in err and "over the limit of 1 KiB" in err
