"""The partitioned program: collectives where shardings differ, reuse of resharded values, local
shapes, partial results, errors for bad plans, and every device's computation (run here in numpy
by the documented local-compute rule) equal to the unsharded graph.

The graph zoo, the plan generator and `run_program` are shared with the MLIR and collective
optimisation tests.
"""

from __future__ import annotations

import pytest

from autoshard.errors import InputError
from autoshard.graph.model import Graph
from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.planning.options import ShardingOption
from autoshard.planning.plan import Plan
from autoshard.sharding import Sharding
from autoshard.spmd.program import LocalOp, check_program, partition
from support.graphs import MESHES, MLP, ZOO, F, assert_runs_like_the_graph, graph_doc, megatron, zoo_programs

O, S = ShardingOption, Sharding


# --- a per-device numpy run of a program, by the rule of autoshard.spmd.program's docstring --------


# --- tests ------------------------------------------------------------------------------------


def test_megatron_mlp_needs_one_all_reduce_of_the_partial_output():
    program = partition(megatron())
    kinds = [type(i).__name__ if isinstance(i, LocalOp) else i.step.kind for i in program.body]
    assert kinds == ["LocalOp", "LocalOp", "LocalOp", "all_reduce"]
    reduce = program.body[3]
    assert reduce.step.mesh_axes == ("tp",) and reduce.step.dims["reduction"] == "sum"
    fc2 = program.body[2]
    assert fc2.outputs[0].sharding == S((("dp",),), ("tp",))
    assert fc2.outputs[0].buffer_shape(program.mesh) == (4, 16)
    assert program.body[0].outputs[0].buffer_shape(program.mesh) == (4, 8)  # h: 8/dp x 32/tp
    assert program.results[0].sharding == S((("dp",),))
    # ring all_reduce over 4 devices of a 4x16 f32 buffer: 2 * 3/4 * 256 bytes at 1 GB/s
    assert program.communication_seconds() == pytest.approx(2 * 0.75 * 256 / 1e9)
    check_program(program)
    assert_runs_like_the_graph(program)


def test_arguments_are_graph_inputs_and_parameters_at_their_storage_sharding():
    program = partition(megatron())
    assert [(v.tensor, v.sharding) for v in program.arguments] == [
        ("x", S((("dp",),))), ("w1", S(((), ("tp",)))), ("w2", S((("tp",),)))]
    assert [v.local_shape(program.mesh, (1, 3)) for v in program.arguments] == [(4, 16), (16, 8), (8, 16)]


def fan_out(mesh: Mesh) -> Graph:
    return graph_from_json(graph_doc(
        "fan", {"a": ((8, 8), F, "input"), "b": ((8, 8), F), "c": ((8, 8), F), "d": ((8, 8), F)},
        [("p", "exp", ["a"], ["b"], {}), ("q", "neg", ["a"], ["c"], {}), ("r", "tanh", ["a"], ["d"], {})],
        ["b", "c", "d"]), mesh)


def test_a_value_resharded_once_is_reused_by_every_consumer_needing_that_sharding():
    mesh = Mesh.of(x=2, y=2)
    graph = fan_out(mesh)
    plan = Plan(graph, mesh, {"p": O(((), ("y",))), "q": O(((), ("y",))), "r": O(((), ("y",)))},
                {"a": S((("x",),))})
    program = partition(plan)
    moves = program.communicates()
    # one chain of collectives from the stored `a`, whose end all three consumers read
    assert moves[0].input.id == program.arguments[0].id
    assert all(b.input.id == a.output.id for a, b in zip(moves, moves[1:]))
    assert all(op.inputs[0].id == moves[-1].output.id for op in program.local_ops())
    assert program.body.index(moves[-1]) < program.body.index(program.local_ops()[0])
    assert_runs_like_the_graph(program)


def test_a_resharding_starts_from_the_cheapest_version_already_made():
    mesh = Mesh.of(x=2, y=2)
    graph = fan_out(mesh)
    # p needs `a` whole (all_gather); q then needs it split over y, which is a free all_slice of
    # the gathered version rather than an all_to_all of the stored one.
    plan = Plan(graph, mesh, {"p": O(((), ())), "q": O(((), ("y",))), "r": O(((), ()))}, {"a": S((("y",),))})
    program = partition(plan)
    kinds = [c.step.kind for c in program.communicates()]
    assert kinds == ["all_gather", "all_slice"]
    gathered, sliced = program.communicates()
    assert sliced.input.id == gathered.output.id
    r = program.local_ops()[2]
    assert r.inputs[0].id == gathered.output.id  # replicated again: the gathered version is reused
    assert_runs_like_the_graph(program)


def test_split_reduction_loops_give_partial_results_reduced_for_their_consumers():
    mesh = Mesh.of(x=2, y=2)
    graph = graph_from_json(ZOO["reduction"], mesh)
    plan = Plan(graph, mesh, {"rowsum": O((("x",), ("y",))), "rowmax": O(((), ("x", "y"))),
                              "colmean": O((("y",), ())), "all": O((("x",),))}, {"x": S()})
    program = partition(plan)
    produced = {op.op.name: op.outputs[0].sharding for op in program.local_ops()}
    assert produced["rowsum"] == S((("x",),), ("y",), "sum")
    assert produced["rowmax"] == S((), ("x", "y"), "max")
    assert produced["colmean"] == S((), ("y",), "sum")
    reductions = {(c.input.tensor, c.step.kind, c.step.dims.get("reduction")) for c in program.communicates()}
    assert ("m", "all_reduce", "max") in reductions and ("mean", "all_reduce", "sum") in reductions
    assert_runs_like_the_graph(program)


def test_graph_outputs_are_delivered_at_their_pinned_sharding():
    mesh = Mesh.of(dp=2, tp=4)
    doc = dict(MLP, constraints=[{"tensor": "y", "split_axes": [[], ["tp"]]}])
    graph = graph_from_json(doc, mesh)
    plan = Plan(graph, mesh, megatron().options, megatron().storage)
    program = partition(plan)
    assert program.results[0].sharding == S(((), ("tp",)))
    # partial over tp and split over dp -> split over tp only: a reduce_scatter onto dim 1, then dp gathered
    assert [c.step.kind for c in program.communicates()] == ["reduce_scatter", "all_gather"]
    assert_runs_like_the_graph(program)


@pytest.mark.parametrize("mesh_text", MESHES)
def test_every_zoo_plan_runs_per_device_like_the_unsharded_graph(mesh_text):
    for name, program in zoo_programs((mesh_text,), count=3):
        check_program(program)
        try:
            assert_runs_like_the_graph(program)
        except AssertionError as error:
            raise AssertionError(f"{name}: {error}") from None


def test_the_zoo_exercises_every_op_kind_and_collective():
    from autoshard.ops import OP_KINDS

    kinds = {op["kind"] for doc in ZOO.values() for op in doc["ops"]}
    families = {"add", "mul", "exp", "gelu", "abs", "cast", "matmul", "batch_matmul", "dot_general", "generic",
                "reduce_sum", "reduce_max", "reduce_mean", "softmax", "layer_norm", "rms_norm", "attention", "conv2d",
                "embedding", "transpose", "reshape", "concat", "slice", "broadcast_in_dim"}
    assert families <= kinds <= set(OP_KINDS)
    steps = {c.step.kind for _, p in zoo_programs() for c in p.communicates()}
    assert steps == {"all_gather", "all_slice", "all_to_all", "all_reduce", "reduce_scatter", "permute", "update_halo"}


# --- bad plans ----------------------------------------------------------------------------------

def bad(plan: Plan) -> list[str]:
    with pytest.raises(InputError) as caught:
        partition(plan)
    return [f"{p.where}: {p.message}" for p in caught.value.problems]


def test_bad_plans_name_the_op_or_tensor_at_fault():
    mesh = Mesh.of(dp=2, tp=4)
    good = megatron(mesh)
    graph = good.graph
    unknown_op = Plan(graph, mesh, {**good.options, "fc3": O(((),))}, good.storage)
    assert any("/ops/fc3" in p and "does not have" in p for p in bad(unknown_op))
    missing = Plan(graph, mesh, {k: v for k, v in good.options.items() if k != "act"}, good.storage)
    assert any("/ops/act" in p for p in bad(missing))
    unknown_tensor = Plan(graph, mesh, good.options, {**good.storage, "z": S()})
    assert any("/tensors/z" in p for p in bad(unknown_tensor))
    rank = Plan(graph, mesh, good.options, {**good.storage, "x": S(((), (), ("dp",)))})
    assert any("/tensors/x" in p and "rank" in p for p in bad(rank))
    axis = Plan(graph, mesh, {**good.options, "fc1": O((("pp",), (), ()))}, good.storage)
    assert any("/ops/fc1" in p and "'pp'" in p for p in bad(axis))


def test_an_option_splitting_a_loop_that_must_stay_whole_is_rejected():
    mesh = Mesh.of(x=2)
    graph = graph_from_json(ZOO["softmax"], mesh)
    plan = Plan(graph, mesh, {"sm": O(((), ("x",)))}, {"x": S()})
    assert any("/ops/sm" in p and "invalid" in p for p in bad(plan))


def test_a_pinned_output_on_an_unknown_axis_is_rejected():
    mesh = Mesh.of(dp=2, tp=4)
    doc = dict(MLP, constraints=[{"tensor": "y", "split_axes": [["zz"]]}])
    graph = graph_from_json(doc)  # no mesh: the axis is only checked against the plan's mesh
    plan = Plan(graph, mesh, megatron(mesh).options, megatron(mesh).storage)
    assert any("/tensors/y" in p and "'zz'" in p for p in bad(plan))
