"""A layer solved once: structural layer kinds, and the composed plan against the whole-graph solve."""

from __future__ import annotations

import json

import pytest

from autoshard.cli.main import main
from autoshard.errors import InputError
from autoshard.graph.layers import layer_ops
from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.models import GPTConfig, MLPConfig, gpt, mlp
from autoshard.planning.compose import plan_layer_once
from autoshard.planning.formulation import formulate
from autoshard.planning.hardware import bind_hardware
from autoshard.planning.layer_kinds import layer_kinds, layer_part
from autoshard.planning.layer_nodes import problem_kinds
from autoshard.planning.make_plan import SolveSettings, make_plan, priced_solution
from autoshard.planning.parts import Parts
from autoshard.sim.program import verify_plan

SETTINGS = SolveSettings(time_limit_s=10, deterministic=True)


def tiny_gpt(layers: int = 2, hidden: int = 64) -> dict:
    return gpt(GPTConfig(layers=layers, hidden=hidden, heads=4, seq=16, batch=4, vocab=128), training=True)


def whole_objective(plan, hw) -> int:
    """The whole graph's formulation objective of `plan`, as `make_plan` prices its own plans
    (each value delivered as `estimate` delivers it)."""
    formulation = formulate(plan.graph, plan.mesh, hw)
    return priced_solution(formulation, hw, formulation.solution(plan, {}))[1]


def test_identical_layers_hash_equal():
    assert [kind.layers for kind in layer_kinds(graph_from_json(tiny_gpt(3)))] == [(0, 1, 2)]
    # the MLP's first layer reads the graph's input (and computes no gradient of it), its last
    # reads the loss gradient straight from the labels: kinds of their own
    kinds = layer_kinds(graph_from_json(mlp(MLPConfig(layers=4, batch=8, hidden=32), training=True)))
    assert [kind.layers for kind in kinds] == [(0,), (1, 2), (3,)]


def test_a_layer_with_another_attribute_or_shape_hashes_apart():
    document = tiny_gpt(3)
    next(op for op in document["ops"] if op["name"] == "layer1.mlp_norm")["eps"] = 1e-6
    assert [kind.layers for kind in layer_kinds(graph_from_json(document))] == [(0, 2), (1,)]

    narrow, wide = graph_from_json(tiny_gpt(2, hidden=64)), graph_from_json(tiny_gpt(2, hidden=128))
    assert (layer_part(narrow, 0, layer_ops(narrow)[0]).signature
            != layer_part(wide, 0, layer_ops(wide)[0]).signature)


def test_layers_whose_nodes_differ_are_kinds_apart():
    """A transformer's first and last layers hash like the others, but the values they hand to
    the embedding's and the head's ops have delivered nodes with other shardings to offer."""
    graph = graph_from_json(tiny_gpt(4))
    mesh = Mesh.parse("dp=2,tp=2")
    formulation = formulate(graph, mesh, bind_hardware("dgx-h100", mesh))
    parts = Parts(formulation.problem, [id(choices) for choices in formulation.choices])
    kinds = problem_kinds(formulation, parts, layer_kinds(graph))
    assert [kind.numbers for kind in kinds] == [(0,), (1, 2), (3,)]
    middle = kinds[1].layers
    # corresponding nodes: the same op of each layer, the same strategies
    assert [formulation.nodes[i][1].split(".", 1)[1] for i in middle[0].nodes[:5]] == \
        [formulation.nodes[i][1].split(".", 1)[1] for i in middle[1].nodes[:5]]
    assert all(formulation.choices[a] == formulation.choices[b] for a, b in zip(middle[0].nodes, middle[1].nodes))


def test_the_composed_gpt_step_simulates_and_brackets_the_whole_graph_solve():
    graph = graph_from_json(tiny_gpt(4))
    mesh = Mesh.parse("dp=2,tp=2")
    hw = bind_hardware("dgx-h100", mesh)
    composed = plan_layer_once(graph, mesh, hw, SETTINGS)
    whole = make_plan(graph, mesh, hw, SETTINGS)
    assert verify_plan(composed.plan, hw.collective_seconds).passed
    solver = composed.solver
    # layers 1 and 2 solved once; the first and last with the embedding and the head
    assert solver["composition"]["kinds"] == 1 and solver["composition"]["layers"] == 2
    # the composed objective is what make_plan's objective would be for the composed plan
    assert solver["objective_ps"] == whole_objective(composed.plan, hw)
    composition = solver["composition"]
    assert composition["layer_ps"] + composition["rest_ps"] + composition["boundary_ps"] == solver["objective_ps"]
    assert solver["objective_ps"] >= whole.solver["lower_bound_ps"]
    assert solver["lower_bound_ps"] <= whole.solver["objective_ps"]


@pytest.mark.parametrize("mesh_text", ["tp=2", "dp=2,tp=2"])
def test_the_composed_bound_is_below_the_whole_graph_optimum(mesh_text):
    graph = graph_from_json(mlp(MLPConfig(layers=4, batch=8, hidden=32), training=True))
    mesh = Mesh.parse(mesh_text)
    hw = bind_hardware("dgx-h100", mesh)
    exact = SolveSettings(time_limit_s=20, deterministic=True, gap_limit=0.0)
    whole = make_plan(graph, mesh, hw, exact)
    composed = plan_layer_once(graph, mesh, hw, exact)
    assert whole.solver["status"] == "optimal"
    assert composed.solver["lower_bound_ps"] <= whole.solver["objective_ps"] <= composed.solver["objective_ps"]
    # its first and last layers are kinds of their own, aligned with their neighbours after the first solves
    assert composed.solver["objective_ps"] <= 1.01 * whole.solver["objective_ps"]
    assert verify_plan(composed.plan, hw.collective_seconds).passed


def test_a_tight_budget_takes_smaller_frontier_points_and_is_met():
    graph = graph_from_json(tiny_gpt(4))
    mesh = Mesh.parse("dp=2,tp=2")
    hw = bind_hardware("dgx-h100", mesh)
    loose = plan_layer_once(graph, mesh, hw, SETTINGS)
    budget = int(0.8 * loose.report.peak_memory_bytes)
    # against the clock: CP-SAT's fixed work on the memory-limited frontier points takes minutes
    tight = plan_layer_once(graph, mesh, hw, SolveSettings(time_limit_s=4, memory_budget_bytes=budget))
    assert tight.report.peak_memory_bytes <= budget
    assert len(tight.solver["composition"]["per_kind"][0]["frontier"]) > 1
    assert tight.solver["objective_ps"] >= loose.solver["lower_bound_ps"]


def test_without_two_layers_of_one_problem_the_whole_graph_is_solved():
    graph = graph_from_json(tiny_gpt(2))  # its layers are the first and the last
    mesh = Mesh.parse("dp=2,tp=2")
    hw = bind_hardware("dgx-h100", mesh)
    composed = plan_layer_once(graph, mesh, hw, SETTINGS)
    assert composed.solver["composition"] == {"method": "whole", "kinds": 0, "layers": 0}
    assert composed.solver["objective_ps"] == make_plan(graph, mesh, hw, SETTINGS).solver["objective_ps"]


def test_a_graph_without_layers_is_refused():
    document = mlp(MLPConfig(layers=2, batch=8, hidden=32))
    for op in document["ops"]:
        op.pop("layer", None)
    graph = graph_from_json(document)
    mesh = Mesh.parse("tp=2")
    with pytest.raises(InputError, match="declares no layers"):
        plan_layer_once(graph, mesh, bind_hardware("dgx-h100", mesh), SETTINGS)


def test_plan_layer_once_on_the_command_line(tmp_path, capsys):
    graph = tmp_path / "gpt.json"
    graph.write_text(json.dumps(tiny_gpt(4)))
    out = tmp_path / "out"
    assert main(["plan", str(graph), "--mesh", "dp=2,tp=2", "--topology", "dgx-h100", "--deterministic",
                 "--layer-once", "-o", str(out)]) == 0
    document = json.loads((out / "plan.json").read_text())
    assert document["solver"]["composition"]["kinds"] == 1
    assert document["verification"]["status"] == "passed"
    assert "composed from 1 layer kind" in capsys.readouterr().out
