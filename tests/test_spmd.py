"""The partitioned program: collectives where shardings differ, reuse of resharded values, local
shapes, partial results, errors for bad plans, and every device's computation (run here in numpy
by the documented local-compute rule) equal to the unsharded graph.

The graph zoo, the plan generator and `run_program` are shared with the MLIR and collective
optimisation tests.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from autoshard.errors import InputError
from autoshard.graph.evaluate import evaluate_graph, random_inputs
from autoshard.graph.model import Graph
from autoshard.mesh import Mesh
from autoshard.ops import Block, evaluate_block
from autoshard.planning.options import ShardingOption
from autoshard.planning.plan import Plan
from autoshard.graph.schema import graph_from_json
from autoshard.sharding import Sharding, ceildiv
from autoshard.sim.layout import assemble, distribute
from autoshard.sim.reshard_exec import apply_step
from autoshard.spmd.program import Communicate, LocalOp, SpmdProgram, check_program, partition
from autoshard.planning.options import enumerate_options, enumerate_storage

O, S = ShardingOption, Sharding
F = "f32"


def graph_doc(name: str, tensors: dict[str, tuple], ops: list[tuple], outputs: list[str] | None = None,
              constraints: list[dict] | None = None) -> dict[str, Any]:
    """tensors: name -> (shape, dtype[, role]); ops: (name, kind, inputs, outputs, attrs)."""
    return {"format": "autoshard.graph/v1", "name": name,
            "tensors": {k: {"shape": list(v[0]), "dtype": v[1], **({"role": v[2]} if len(v) > 2 else {})}
                        for k, v in tensors.items()},
            "ops": [{"name": n, "kind": k, "inputs": i, "outputs": o, **a} for n, k, i, o, a in ops],
            **({"outputs": outputs} if outputs else {}), **({"constraints": constraints} if constraints else {})}


MLP = graph_doc("mlp", {"x": ((8, 16), F, "input"), "w1": ((16, 32), F, "parameter"), "w2": ((32, 16), F, "parameter"),
                        "h": ((8, 32), F), "a": ((8, 32), F), "y": ((8, 16), F)},
                [("fc1", "matmul", ["x", "w1"], ["h"], {}), ("act", "gelu", ["h"], ["a"], {}),
                 ("fc2", "matmul", ["a", "w2"], ["y"], {})])

# One small graph per family of op kinds; together they use every kind of the op table.
ZOO: dict[str, dict[str, Any]] = {
    "mlp": MLP,
    "reduction": graph_doc(
        "reduction", {"x": ((8, 12), F, "input"), "s": ((8,), F), "m": ((8,), F), "mean": ((1, 12), F), "total": ((), F)},
        [("rowsum", "reduce_sum", ["x"], ["s"], {"dims": [1]}), ("rowmax", "reduce_max", ["x"], ["m"], {"dims": [1]}),
         ("colmean", "reduce_mean", ["x"], ["mean"], {"dims": [0], "keepdims": True}),
         ("all", "reduce_sum", ["s"], ["total"], {})], ["m", "mean", "total"]),
    "chain": graph_doc(
        "chain", {"x": ((8, 16), F, "input"), "b": ((16,), F, "parameter"), "y": ((8, 16), F), "e": ((8, 16), F),
                  "z": ((8, 16), F), "c": ((8, 16), "bf16"), "i": ((8, 16), "i32", "input"), "j": ((8, 16), "i32")},
        [("bias", "add", ["x", "b"], ["y"], {}), ("exp", "exp", ["y"], ["e"], {}), ("mul", "mul", ["e", "x"], ["z"], {}),
         ("cast", "cast", ["z"], ["c"], {"dtype": "bf16"}), ("iabs", "abs", ["i"], ["j"], {})], ["c", "j"]),
    "transpose": graph_doc("transpose", {"x": ((4, 6, 8), F, "input"), "t": ((8, 4, 6), F)},
                           [("tr", "transpose", ["x"], ["t"], {"perm": [2, 0, 1]})]),
    "reshape": graph_doc(
        "reshape", {"x": ((8, 4, 6), F, "input"), "m": ((8, 24), F), "s": ((8, 2, 12), F), "r": ((16, 12), F)},
        [("merge", "reshape", ["x"], ["m"], {"shape": [8, 24]}), ("split", "reshape", ["m"], ["s"], {"shape": [8, 2, 12]}),
         ("mixed", "reshape", ["m"], ["r"], {"shape": [16, 12]})], ["s", "r"]),
    "softmax": graph_doc("softmax", {"x": ((8, 16), F, "input"), "p": ((8, 16), F)},
                         [("sm", "softmax", ["x"], ["p"], {"axis": 1})]),
    "norms": graph_doc(
        "norms", {"x": ((6, 8), F, "input"), "g": ((8,), F, "parameter"), "beta": ((8,), F, "parameter"),
                  "ln": ((6, 8), F), "rms": ((6, 8), F)},
        [("ln", "layer_norm", ["x", "g", "beta"], ["ln"], {}), ("rms", "rms_norm", ["ln", "g"], ["rms"], {})]),
    "attention": graph_doc(
        "attention", {"q": ((2, 2, 4, 8), F, "input"), "k": ((2, 2, 6, 8), F, "input"), "v": ((2, 2, 6, 4), F, "input"),
                      "o": ((2, 2, 4, 4), F)},
        [("sdpa", "attention", ["q", "k", "v"], ["o"], {"causal": True})]),
    "conv": graph_doc(
        "conv", {"x": ((2, 6, 6, 4), F, "input"), "w": ((3, 3, 4, 8), F, "parameter"), "y": ((2, 3, 3, 8), F)},
        [("conv", "conv2d", ["x", "w"], ["y"], {"strides": [2, 2], "padding": [[1, 1], [1, 1]]})]),
    "embedding": graph_doc(
        "embedding", {"ids": ((4, 6), "i32", "input"), "table": ((16, 8), F, "parameter"), "e": ((4, 6, 8), F)},
        [("lookup", "embedding", ["ids", "table"], ["e"], {})]),
    "structural": graph_doc(
        "structural", {"a": ((4, 6), F, "input"), "b": ((4, 2), F, "input"), "c": ((4, 8), F), "s": ((4, 3), F),
                       "r": ((4,), F, "input"), "bc": ((3, 4), F)},
        [("cat", "concat", ["a", "b"], ["c"], {"axis": 1}),
         ("cut", "slice", ["c"], ["s"], {"starts": [0, 1], "limits": [4, 7], "strides": [1, 2]}),
         ("bcast", "broadcast_in_dim", ["r"], ["bc"], {"shape": [3, 4], "broadcast_dimensions": [1]})], ["s", "bc"]),
    "contractions": graph_doc(
        "contractions", {"a": ((2, 4, 6), F, "input"), "b": ((2, 6, 8), F, "input"), "c": ((2, 4, 8), F),
                         "w": ((8, 4), F, "parameter"), "d": ((2, 4, 4), F), "rows": ((2, 4), F)},
        [("bmm", "batch_matmul", ["a", "b"], ["c"], {}),
         ("dg", "dot_general", ["c", "w"], ["d"], {"lhs_contracting_dims": [2], "rhs_contracting_dims": [0]}),
         ("rowsum", "generic", ["d"], ["rows"], {"iterator_types": ["parallel", "parallel", "reduction"],
                                                  "indexing_maps": ["(d0, d1, d2) -> (d0, d1, d2)", "(d0, d1, d2) -> (d0, d1)"],
                                                  "payload": "add"})], ["rows"]),
}
MESHES = ("x=2,y=2", "x=3,y=2", "x=4", "x=2,y=2,z=2")


def cycled_plans(graph: Graph, mesh: Mesh, count: int) -> list[Plan]:
    """`count` deterministic plans: plan k gives op i its option number k*(i+3) and stored tensor i
    its storage number k*(i+2) (modulo how many there are), so plans mix splits, partial
    reductions, uneven shards and reshardings of every kind."""
    plans = []
    for k in range(count):
        options = {}
        for i, op in enumerate(graph.ops):
            choices = enumerate_options(op.nest, mesh)
            options[op.name] = choices[(k * (i + 3)) % len(choices)]
        stored = [t for t in graph.tensors.values() if t.role != "intermediate"]
        storage = {t.name: enumerate_storage(t.shape, mesh)[(k * (i + 2)) % len(enumerate_storage(t.shape, mesh))]
                   for i, t in enumerate(stored)}
        plans.append(Plan(graph, mesh, options, storage))
    return plans


def zoo_programs(meshes=MESHES, count: int = 4) -> list[tuple[str, SpmdProgram]]:
    programs = []
    for text in meshes:
        mesh = Mesh.parse(text)
        for name, doc in ZOO.items():
            graph = graph_from_json(doc, mesh)
            programs += [(f"{name}@{text}#{k}", partition(plan)) for k, plan in enumerate(cycled_plans(graph, mesh, count))]
    return programs


# --- a per-device numpy run of a program, by the rule of autoshard.spmd.program's docstring --------

def device_block(mesh: Mesh, op: LocalOp, device: tuple[int, ...]) -> Block:
    starts, sizes = [], []
    for extent, axes in zip(op.op.nest.extents, op.option.loop_axes):
        step = ceildiv(extent, mesh.group_size(axes))
        start = min(mesh.in_group_linear(device, axes) * step, extent)
        starts.append(start)
        sizes.append(min(start + step, extent) - start)
    return Block(tuple(starts), tuple(sizes), op.op.nest.extents)


def run_program(program: SpmdProgram, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every device runs the body; returns each result assembled from the devices' shards."""
    mesh = program.mesh
    env = {v.id: distribute(inputs[v.tensor], mesh, v.sharding) for v in program.arguments}
    for instruction in program.body:
        if isinstance(instruction, Communicate):
            env[instruction.output.id] = apply_step(env[instruction.input.id], mesh, instruction.input.shape,
                                                    instruction.step)
            continue
        nest = instruction.op.nest
        results: list[dict] = [{} for _ in instruction.outputs]
        for device in mesh.devices():
            block = device_block(mesh, instruction, device)
            assert 0 not in block.sizes, "the zoo's options leave no device without work"
            cut = []
            for value, map_ in zip(instruction.inputs, nest.input_maps):
                need = nest.operand_range(map_, block, value.shape)
                held = value.sharding.device_slices(mesh, value.shape, device)
                cut.append(env[value.id][device][tuple(slice(n.start - h.start, n.stop - h.start)
                                                       for n, h in zip(need, held))])
            for k, result in enumerate(evaluate_block(instruction.op.op_kind, nest, instruction.op.attrs, cut, block)):
                results[k][device] = np.asarray(result)
        for value, shards in zip(instruction.outputs, results):
            env[value.id] = shards
    return {v.tensor: assemble(env[v.id], mesh, v.sharding, v.shape) for v in program.results}


def assert_runs_like_the_graph(program: SpmdProgram, seed: int = 0) -> None:
    inputs = random_inputs(program.graph, seed)
    reference = evaluate_graph(program.graph, inputs)
    for name, value in run_program(program, inputs).items():
        np.testing.assert_allclose(value, reference[name], rtol=1e-4, atol=1e-5, err_msg=name)


# --- tests ------------------------------------------------------------------------------------

def megatron(mesh: Mesh = Mesh.of(dp=2, tp=4)) -> Plan:
    graph = graph_from_json(MLP, mesh)
    return Plan(graph, mesh, {"fc1": O((("dp",), ("tp",), ())), "act": O((("dp",), ("tp",))),
                              "fc2": O((("dp",), (), ("tp",)))},
                {"x": S((("dp",),)), "w1": S(((), ("tp",))), "w2": S((("tp",),))})


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
    assert steps == {"all_gather", "all_slice", "all_to_all", "all_reduce", "reduce_scatter", "permute"}


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
