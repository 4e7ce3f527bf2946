"""A training step's state is updated in place: parameters, gradients and Adam moments are
counted once in liveness, the formulation's memory rows, the report and the simulator."""

from __future__ import annotations

import pytest

from autoshard.errors import InputError
from autoshard.graph.model import live_ranges
from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.models.gpt import GPTConfig, gpt
from autoshard.models.mlp import MLPConfig, mlp
from autoshard.planning.formulation import formulate
from autoshard.planning.hardware import bind_hardware
from autoshard.planning.options import ShardingOption, result_shardings
from autoshard.planning.plan import Plan
from autoshard.planning.report import estimate, memory_timeline
from autoshard.sharding import Sharding
from autoshard.sim.program import simulate_program
from autoshard.spmd.program import partition


def replicated_plan(graph, mesh: Mesh) -> Plan:
    options = {op.name: ShardingOption.replicated(len(op.nest.extents)) for op in graph.ops}
    storage = {t.name: Sharding.replicated() for t in graph.tensors.values() if t.role != "intermediate"}
    return Plan(graph, mesh, options, storage)


@pytest.fixture(scope="module")
def gpt_step():
    return graph_from_json(gpt(GPTConfig(layers=2, hidden=64, heads=4, seq=16, batch=2, vocab=128), training=True))


def test_every_parameter_and_moment_is_updated_in_place_and_has_one_gradient(gpt_step):
    graph = gpt_step
    params = [t.name for t in graph.tensors_with_role("parameter")]
    weights = [p for p in params if not p.startswith("adam.")]
    assert sorted(graph.updated_by) == sorted(params)
    assert sorted(graph.gradients) == sorted(weights)
    for old, new in graph.updated_by.items():
        assert graph.tensors[new].shape == graph.tensors[old].shape and new in graph.outputs


def test_a_training_step_holds_parameters_gradients_moments_and_live_activations_byte_for_byte(gpt_step):
    graph = gpt_step
    plan = replicated_plan(graph, Mesh.parse("x=1"))
    usage, params_held = memory_timeline(plan)
    order = list(graph.order)
    state_bytes = sum(t.bytes for t in graph.tensors_with_role("parameter"))
    loss_bytes = graph.tensors["loss"].bytes
    # the last step: the new state in the old one's place, the loss and what the last op reads
    # besides the state; nothing twice
    last_reads = sum(graph.tensors[t].bytes for t in order[-1].inputs if graph.tensors[t].role == "intermediate")
    assert usage[-1] == state_bytes + loss_bytes + last_reads
    assert params_held[-1] == state_bytes
    # when the optimizer starts: state, every gradient, the optimizer's scalars, the loss and the
    # first optimizer op's result; every activation of forward and backward is gone
    phases = graph.phases
    first = next(i for i, op in enumerate(order) if phases[op.name] == "optimizer")
    gradient_bytes = sum(graph.tensors[g].bytes for g in graph.gradients.values())
    scalars = sum(graph.tensors[t].bytes for t in graph.tensors if t.startswith("adam.") and graph.tensors[t].role == "input")
    assert usage[first] == state_bytes + gradient_bytes + scalars + loss_bytes + graph.tensors[order[first].outputs[0]].bytes
    report = estimate(plan, bind_hardware("dgx-h100", plan.mesh))
    assert report.peak_memory_bytes == int(usage.max())
    # bytes per weight held as state: bf16 weights and two f32 moments, counted once
    weight_elements = sum(t.bytes // t.itemsize for t in graph.tensors_with_role("parameter") if not t.name.startswith("adam."))
    assert state_bytes / weight_elements == pytest.approx(10.0)


def test_an_overwritten_value_is_held_until_its_new_value_takes_its_place(gpt_step):
    graph = gpt_step
    order = list(graph.order)
    at = {op.name: i for i, op in enumerate(order)}
    ranges = live_ranges(graph, order)
    for old, new in graph.updated_by.items():
        written = at[graph.producers[new].name]
        assert ranges[old] == (0, written - 1)
        assert ranges[new] == (written, len(order) - 1)
        # every other reader of the old value runs before it is overwritten
        assert all(at[op.name] < written for op in graph.consumers[old] if op is not graph.producers[new])


def test_the_formulation_stores_each_new_value_into_its_old_storage(gpt_step):
    graph = gpt_step
    mesh = Mesh.parse("dp=2,tp=2")
    formulation = formulate(graph, mesh, bind_hardware("dgx-h100", mesh))
    written = [(t, old) for t, old, i in formulation.uses if i == -1]
    assert sorted(written) == sorted((new, old) for old, new in graph.updated_by.items())
    nodes = {node: i for i, node in enumerate(formulation.nodes)}
    for (u, v), matrix, (t, consumer, i) in zip(formulation.problem.edges, formulation.problem.edge_costs, formulation.uses):
        if i != -1:
            continue
        assert (int(u), int(v)) == (nodes[("op", graph.producers[t].name)], nodes[("storage", consumer)])
        # storing it as the old value is stored is free; storing what was made split as a whole
        # needs an all_gather
        choices = formulation.choices[int(v)]
        producer = graph.producers[t]
        for a, option in enumerate(formulation.choices[int(u)]):
            produced = result_shardings(producer.nest, option)[0]
            for b, storage in enumerate(choices):
                if produced == storage:
                    assert matrix[a, b] == 0
                if produced.used_axes() and not storage.used_axes():
                    assert matrix[a, b] > 0


def test_the_simulator_refuses_to_read_a_value_after_it_is_overwritten():
    doc = {"format": "autoshard.graph/v1", "name": "sgd",
           "tensors": {"w": {"shape": [4, 4], "dtype": "f32", "role": "parameter"},
                       "g": {"shape": [4, 4], "dtype": "f32", "role": "input"},
                       "w.new": {"shape": [4, 4], "dtype": "f32", "updates": "w"},
                       "y": {"shape": [4, 4], "dtype": "f32"}},
           "ops": [{"name": "w.new", "kind": "sub", "inputs": ["w", "g"], "outputs": ["w.new"]},
                   {"name": "y", "kind": "mul", "inputs": ["w", "w.new"], "outputs": ["y"]}],
           "outputs": ["w.new", "y"]}
    # `y` reads the old `w` and the new one: the new one can only be made after `y`, which needs it
    with pytest.raises(InputError, match="cycle"):
        graph_from_json(doc)
    doc["ops"][1] = {"name": "y", "kind": "mul", "inputs": ["w", "g"], "outputs": ["y"]}
    graph = graph_from_json(doc)
    assert [op.name for op in graph.order] == ["y", "w.new"]  # the other reader of `w` runs first
    mesh = Mesh.parse("x=2")
    plan = replicated_plan(graph, mesh)
    assert simulate_program(partition(plan)).passed
    program = partition(plan)
    # a program that reads `w` after its new value was written is refused, naming both
    body = list(program.body)
    body.reverse()
    stale = type(program)(program.mesh, program.graph, program.arguments, tuple(body), program.results, program.price)
    verdict = simulate_program(stale)
    assert not verdict.passed and "after 'w.new' overwrote it in place" in verdict.first_divergence.message


def test_a_new_value_is_delivered_in_the_storage_sharding_of_the_value_it_overwrites():
    graph = graph_from_json(mlp(MLPConfig(layers=1, batch=4, hidden=8, ffn=16, dtype="f32"), training=True))
    mesh = Mesh.parse("x=2")
    plan = replicated_plan(graph, mesh)
    w = "layer0.w1"
    split = Sharding(((), ("x",)))
    storage = dict(plan.storage)
    for name in (w, f"adam.{w}.m", f"adam.{w}.v"):
        storage[name] = split
    plan = Plan(graph, mesh, plan.options, storage)
    assert plan.final(graph.updated_by[w]) == split
    program = partition(plan)
    results = {v.tensor: v.sharding for v in program.results}
    assert results[graph.updated_by[w]] == split
    verdict = simulate_program(program)
    assert verdict.passed, verdict.first_divergence


@pytest.mark.parametrize("field, value, message", [
    ("updates", "nothing", "no tensor has that name"),
    ("updates", "g", "only an input or a parameter can be overwritten"),
    ("grad_of", "g", "only parameters have gradients"),
])
def test_state_declarations_that_cannot_hold_are_refused_with_their_pointer(field, value, message):
    doc = {"format": "autoshard.graph/v1", "name": "bad",
           "tensors": {"w": {"shape": [4], "dtype": "f32", "role": "parameter"},
                       "x": {"shape": [4], "dtype": "f32", "role": "input"},
                       "g": {"shape": [4], "dtype": "f32"},
                       "w.new": {"shape": [4], "dtype": "f32"}},
           "ops": [{"name": "g", "kind": "mul", "inputs": ["w", "x"], "outputs": ["g"]},
                   {"name": "w.new", "kind": "sub", "inputs": ["w", "g"], "outputs": ["w.new"]}],
           "outputs": ["w.new"]}
    doc["tensors"]["w.new"][field] = value
    with pytest.raises(InputError) as error:
        graph_from_json(doc)
    assert any(p.where == f"/tensors/w.new/{field}" and message in p.message for p in error.value.problems)


def test_batch_dim_only_on_inputs_and_within_their_rank():
    doc = {"format": "autoshard.graph/v1", "name": "bad",
           "tensors": {"x": {"shape": [4, 2], "dtype": "f32", "role": "input", "batch_dim": 2},
                       "w": {"shape": [2], "dtype": "f32", "role": "parameter", "batch_dim": 0},
                       "y": {"shape": [4, 2], "dtype": "f32"}},
           "ops": [{"name": "y", "kind": "mul", "inputs": ["x", "w"], "outputs": ["y"]}]}
    with pytest.raises(InputError) as error:
        graph_from_json(doc)
    pointers = {p.where for p in error.value.problems}
    assert pointers == {"/tensors/x/batch_dim", "/tensors/w/batch_dim"}
