"""Collective optimisations: each rewrite on the program shape it targets, its reported change, its
cost, and the optimised program run on every device (numpy, per the documented local rule) equal to
the unsharded graph."""

from __future__ import annotations

import dataclasses

import pytest

from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.planning.options import ShardingOption
from autoshard.planning.plan import Plan
from autoshard.resharding import plan_resharding
from autoshard.sharding import Sharding
from autoshard.spmd.collective_opt import optimize
from autoshard.spmd.program import Communicate, SpmdProgram, check_program, partition
from autoshard.spmd.rewrites import REWRITES
from autoshard.spmd.surgery import local_flops, reduction_step
from support.graphs import MESHES, ZOO, assert_runs_like_the_graph, cycled_plans, graph_doc, mlp2d

O, S = ShardingOption, Sharding
F = "f32"
RULES = {r.name: r for r in REWRITES}


def kinds(program: SpmdProgram) -> list[str]:
    return [c.step.kind for c in program.communicates()]


def two_branches(mesh: Mesh, combine: str = "add", tail_options: dict | None = None) -> Plan:
    """p = x1 @ w1 and q = x2 @ w2, both contracting over tp (partial sums), s = combine(p, q),
    then relu and exp."""
    tensors = {"x1": ((8, 16), F, "input"), "x2": ((8, 16), F, "input"), "w1": ((16, 8), F, "parameter"),
               "w2": ((16, 8), F, "parameter"), "p": ((8, 8), F), "q": ((8, 8), F), "s": ((8, 8), F),
               "r": ((8, 8), F), "e": ((8, 8), F)}
    ops = [("m1", "matmul", ["x1", "w1"], ["p"], {}), ("m2", "matmul", ["x2", "w2"], ["q"], {}),
           ("sum", combine, ["p", "q"], ["s"], {}), ("act", "relu", ["s"], ["r"], {}), ("ex", "exp", ["r"], ["e"], {})]
    graph = graph_from_json(graph_doc("two_branches", tensors, ops, ["e"]), mesh)
    tail = tail_options or {"sum": O((("dp",), ())), "act": O((("dp",), ())), "ex": O((("dp",), ("tp",)))}
    return Plan(graph, mesh, {"m1": O((("dp",), (), ("tp",))), "m2": O((("dp",), (), ("tp",))), **tail},
                {"x1": S((("dp",), ("tp",))), "x2": S((("dp",), ("tp",))), "w1": S((("tp",),)), "w2": S((("tp",),))})


def test_all_reduces_before_an_add_become_one_after_it():
    program = partition(two_branches(Mesh.of(dp=2, tp=4)))
    assert kinds(program) == ["all_reduce", "all_reduce", "all_slice"]
    optimized, changes = optimize(program, [RULES["reassociate_all_reduce"]])
    assert [c.rewrite for c in changes] == ["reassociate_all_reduce"]
    assert kinds(optimized) == ["all_reduce", "all_slice"]
    add = next(op for op in optimized.local_ops() if op.op.name == "sum")
    assert add.outputs[0].sharding == S((("dp",),), ("tp",))  # the add now makes a partial sum
    assert changes[0].seconds_after == pytest.approx(changes[0].seconds_before / 2)
    assert_runs_like_the_graph(optimized)


def test_the_full_pipeline_leaves_one_reduce_scatter_and_no_gather():
    program = partition(two_branches(Mesh.of(dp=2, tp=4)))
    optimized, changes = optimize(program)
    assert [c.rewrite for c in changes] == ["reassociate_all_reduce", "decompose_all_reduce", "merge_reshardings"]
    assert "all_gather + all_slice of 'r' replanned as nothing" in changes[-1].detail
    assert kinds(optimized) == ["reduce_scatter"]
    assert optimized.communication_seconds() == pytest.approx(program.communication_seconds() / 4)
    assert [c.seconds_after for c in changes] == sorted((c.seconds_after for c in changes), reverse=True)
    check_program(optimized)
    assert_runs_like_the_graph(optimized)


def test_reduce_scatters_before_a_sub_become_one_after_it():
    tail = {"sum": O((("dp", "tp"), ())), "act": O((("dp", "tp"), ())), "ex": O((("dp", "tp"), ()))}
    program = partition(two_branches(Mesh.of(dp=2, tp=4), "sub", tail))
    assert kinds(program) == ["reduce_scatter", "reduce_scatter"]
    optimized, changes = optimize(program)
    assert [c.rewrite for c in changes] == ["reassociate_reduce_scatter"]
    assert kinds(optimized) == ["reduce_scatter"]
    sub = next(op for op in optimized.local_ops() if op.op.name == "sum")
    assert sub.option == O((("dp",), ())) and sub.outputs[0].sharding.partial_axes == ("tp",)
    assert_runs_like_the_graph(optimized)


def test_only_ops_linear_in_the_partial_values_are_reassociated():
    mesh = Mesh.of(dp=2, tp=4)
    program = partition(two_branches(mesh, "mul"))  # (sum a)(sum b) is not sum(ab)
    optimized, changes = optimize(program, [RULES["reassociate_all_reduce"]])
    assert changes == [] and optimized == program
    tensors = {"a": ((8, 16), F, "input"), "b": ((8, 16), F, "input"), "ma": ((8,), F), "mb": ((8,), F), "m": ((8,), F),
               "s": ((8,), F)}
    ops = [("ra", "reduce_max", ["a"], ["ma"], {"dims": [1]}), ("rb", "reduce_max", ["b"], ["mb"], {"dims": [1]}),
           ("top", "max", ["ma", "mb"], ["m"], {}), ("both", "add", ["ma", "mb"], ["s"], {})]
    graph = graph_from_json(graph_doc("maxima", tensors, ops, ["m", "s"]), mesh)
    plan = Plan(graph, mesh, {"ra": O(((), ("tp",))), "rb": O(((), ("tp",))), "top": O(((),)), "both": O(((),))},
                {"a": S(((), ("tp",))), "b": S(((), ("tp",)))})
    program = partition(plan)
    # ma and mb are max-partial; each is reduced once and read by both ops, so nothing is rewritten
    assert kinds(program) == ["all_reduce", "all_reduce"]
    assert optimize(program)[1] == []
    only_max = Plan(graph_from_json(graph_doc("maxima", {k: v for k, v in tensors.items() if k != "s"}, ops[:3], ["m"]),
                                    mesh), mesh,
                    {"ra": O(((), ("tp",))), "rb": O(((), ("tp",))), "top": O(((),))}, plan.storage)
    optimized, changes = optimize(partition(only_max))
    assert [c.rewrite for c in changes] == ["reassociate_all_reduce"]
    (reduce,) = optimized.communicates()
    assert reduce.step.dims["reduction"] == "max"
    assert_runs_like_the_graph(optimized)


def split_reduction(program: SpmdProgram) -> SpmdProgram:
    """The program with its all_reduce over [x, y] done as one over x then one over y."""
    index, reduce = next((i, c) for i, c in enumerate(program.body)
                         if isinstance(c, Communicate) and c.step.kind == "all_reduce")
    first = reduction_step(program, reduce.input, "all_reduce", ("x",))
    middle = dataclasses.replace(reduce.input, id=program.next_id(), sharding=first.after)
    second = reduction_step(program, middle, "all_reduce", ("y",))
    body = program.body[:index] + (Communicate(first, reduce.input, middle), Communicate(second, middle, reduce.output)) \
        + program.body[index + 1:]
    return dataclasses.replace(program, body=body)


def test_consecutive_all_reduces_fold_into_one():
    mesh = Mesh.of(x=2, y=2)
    graph = graph_from_json(ZOO["mlp"], mesh)
    plan = Plan(graph, mesh, {"fc1": O(((), (), ())), "act": O(((), ())), "fc2": O(((), (), ("x", "y")))},
                {"x": S(), "w1": S(), "w2": S((("x", "y"),))})
    program = split_reduction(partition(plan))
    check_program(program)
    assert [(c.step.kind, c.step.mesh_axes) for c in program.communicates()][-2:] == [("all_reduce", ("x",)),
                                                                                   ("all_reduce", ("y",))]
    optimized, changes = optimize(program, [RULES["fold_all_reduce"]])
    assert [c.rewrite for c in changes] == ["fold_all_reduce"]
    assert [(c.step.kind, c.step.mesh_axes) for c in optimized.communicates()][-1:] == [("all_reduce", ("x", "y"))]
    # two rings of 2 move 2 * 1/2 each; one ring of 4 moves 2 * 3/4
    assert changes[0].seconds_before - changes[0].seconds_after == pytest.approx(0.5 * 8 * 16 * 4 / 1e9)
    assert_runs_like_the_graph(optimized)


def test_a_collective_nobody_reads_is_dropped():
    program = partition(two_branches(Mesh.of(dp=2, tp=4)))
    stored = program.arguments[0]  # x1, [[dp], [tp]]
    (step,) = plan_resharding(program.mesh, stored.shape, 4, stored.sharding, S((("dp",),)), program.price).steps
    unused = Communicate(step, stored, dataclasses.replace(stored, id=program.next_id(), sharding=step.after))
    padded = dataclasses.replace(program, body=(unused,) + program.body)
    optimized, changes = optimize(padded, [RULES["drop_unused"]])
    assert [c.detail for c in changes] == ["dropped unused all_gather of 'x1'"]
    assert changes[0].seconds_before - changes[0].seconds_after == pytest.approx(step.seconds)
    assert optimized == program


def test_the_seeds_2d_weight_stationary_mlp_scatters_and_gathers_around_the_relu():
    program = partition(mlp2d())
    assert kinds(program) == ["all_gather", "all_reduce", "reduce_scatter"]
    optimized, changes = optimize(program)
    assert [c.rewrite for c in changes] == ["decompose_all_reduce"]
    assert kinds(optimized) == ["all_gather", "reduce_scatter", "all_gather", "reduce_scatter"]
    # the same bytes move (a ring all_reduce is a reduce_scatter and an all_gather) ...
    assert optimized.communication_seconds() == pytest.approx(program.communication_seconds())
    # ... and the relu runs on an eighth of h instead of a quarter
    assert local_flops(optimized) < local_flops(program)
    assert_runs_like_the_graph(optimized)


def test_an_all_gather_moves_below_the_elementwise_op_reading_it():
    mesh = Mesh.of(x=4)
    graph = graph_from_json(graph_doc("gather_then_tanh", {"a": ((8, 8), F, "input"), "b": ((8, 8), F)},
                                      [("t", "tanh", ["a"], ["b"], {})]), mesh)
    program = partition(Plan(graph, mesh, {"t": O(((), ()))}, {"a": S((("x",),))}))
    assert kinds(program) == ["all_gather"]
    optimized, changes = optimize(program)
    assert [c.rewrite for c in changes] == ["move_all_gather_down"]
    assert optimized.local_ops()[0].option == O((("x",), ()))
    assert isinstance(optimized.body[-1], Communicate) and optimized.results[0].id == program.results[0].id
    assert_runs_like_the_graph(optimized)


@pytest.mark.parametrize("mesh_text", MESHES)
def test_optimizing_any_zoo_program_keeps_its_meaning_and_never_costs_more(mesh_text):
    mesh = Mesh.parse(mesh_text)
    for doc in ZOO.values():
        for plan in cycled_plans(graph_from_json(doc, mesh), mesh, 3):
            program = partition(plan)
            optimized, changes = optimize(program)
            assert optimized.communication_seconds() <= program.communication_seconds() * (1 + 1e-9)
            assert all(c.seconds_after <= c.seconds_before * (1 + 1e-9) for c in changes)
            if changes:
                assert_runs_like_the_graph(optimized)
