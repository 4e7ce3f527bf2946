"""The collective optimisations keep a program's meaning: the program simulates to the reference
before and after `optimize`, on graphs shaped so the rewrites apply (partial values combined by
ops linear in them, reductions before elementwise ops, gathers before elementwise ops)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoshard.graph.model import Graph
from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.planning.options import ShardingOption, enumerate_options, enumerate_storage
from autoshard.planning.plan import Plan
from autoshard.resharding import bytes_moved_price
from autoshard.sharding import Sharding
from autoshard.sim.program import simulate_program
from autoshard.spmd.collective_opt import optimize
from autoshard.spmd.program import LocalOp, check_program, partition

MESHES = [Mesh.of(x=2), Mesh.of(x=4), Mesh.of(x=2, y=2), Mesh.of(x=2, y=3), Mesh.of(x=2, y=2, z=2)]
DIM = st.sampled_from([4, 2, 3, 6, 8, 5])
# Ops that combine partial values of each kind exactly (and `mul`, which must not be reassociated).
COMBINE = {"sum": ["add", "sub", "mul"], "max": ["max", "add"], "min": ["min", "sub"]}
PRODUCER = {"sum": "matmul", "max": "reduce_max", "min": "reduce_min"}


@st.composite
def partial_value_plans(draw: Any) -> Plan:
    """Two or three values made partial by a split reduction, combined, then used elementwise;
    producers split their reduction loop three times in four."""
    mesh = draw(st.sampled_from(MESHES))
    kind = draw(st.sampled_from(sorted(COMBINE)))
    m, k, n = draw(DIM), draw(DIM), draw(DIM)
    tensors: dict[str, dict[str, Any]] = {}
    ops: list[dict[str, Any]] = []

    def tensor(shape: list[int], role: str = "intermediate") -> str:
        name = f"t{len(tensors)}"
        tensors[name] = {"shape": shape, "dtype": "f32", "role": role}
        return name

    def op(kind_: str, inputs: list[str], shape: list[int], **attrs: Any) -> str:
        out = tensor(shape)
        ops.append({"name": f"{kind_}{len(ops)}", "kind": kind_, "inputs": inputs, "outputs": [out], **attrs})
        return out

    def partial() -> str:
        if kind == "sum":
            return op("matmul", [tensor([m, k], "input"), tensor([k, n], "parameter")], [m, n])
        return op(PRODUCER[kind], [tensor([m, n, k], "input")], [m, n], dims=[2])

    value = op(draw(st.sampled_from(COMBINE[kind])), [partial(), partial()], [m, n])
    if draw(st.booleans()):
        value = op(draw(st.sampled_from(COMBINE[kind])), [value, partial()], [m, n])
    for _ in range(draw(st.integers(0, 2))):
        value = op(draw(st.sampled_from(["relu", "tanh", "neg", "exp"])), [value], [m, n])
    graph = graph_from_json({"format": "autoshard.graph/v1", "name": "partials", "tensors": tensors, "ops": ops,
                             "outputs": [value]}, mesh)
    options = {}
    for o in graph.ops:
        choices = enumerate_options(o.nest, mesh)
        reducing = [c for c in choices if any(c.loop_axes[l] for l in o.nest.reduction_loops)]
        options[o.name] = draw(st.sampled_from(reducing if reducing and draw(st.integers(0, 3)) else choices))
    storage = {t.name: draw(st.sampled_from(enumerate_storage(t.shape, mesh)))
               for t in graph.tensors.values() if t.role != "intermediate"}
    return Plan(graph, mesh, options, storage)


@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(partial_value_plans())
def test_optimised_programs_simulate_to_the_reference_as_before(plan):
    program = partition(plan, bytes_moved_price(plan.mesh))
    before = simulate_program(program, seed=2)
    assert before.passed, before.summary()
    optimised, changes = optimize(program)
    check_program(optimised)
    after = simulate_program(optimised, seed=2)
    assert after.passed, f"{after.summary()}\nafter {[c.detail for c in changes]}"


def tensor(shape: list[int], role: str = "intermediate") -> dict[str, Any]:
    return {"shape": shape, "dtype": "f32", "role": role}


def two_products(combine: str, tail: str | None = None) -> Graph:
    """p = a @ w1, q = b @ w2, s = combine(p, q), optionally y = tail(s)."""
    tensors = {"a": tensor([4, 6], "input"), "w1": tensor([6, 4], "parameter"), "b": tensor([4, 6], "input"),
               "w2": tensor([6, 4], "parameter"), "p": tensor([4, 4]), "q": tensor([4, 4]), "s": tensor([4, 4])}
    ops = [{"name": "mm1", "kind": "matmul", "inputs": ["a", "w1"], "outputs": ["p"]},
           {"name": "mm2", "kind": "matmul", "inputs": ["b", "w2"], "outputs": ["q"]},
           {"name": "combine", "kind": combine, "inputs": ["p", "q"], "outputs": ["s"]}]
    if tail:
        tensors["y"] = tensor([4, 4])
        ops.append({"name": "tail", "kind": tail, "inputs": ["s"], "outputs": ["y"]})
    return graph_from_json({"format": "autoshard.graph/v1", "name": "products", "tensors": tensors, "ops": ops,
                            "outputs": ["y" if tail else "s"]})


MESH = Mesh.of(x=2, y=2)
WHOLE, ROWS, CONTRACT = ShardingOption(((), (), ())), ShardingOption((("x",), (), ())), ShardingOption(((), (), ("x",)))
CASES = {
    "reassociate_all_reduce": (two_products("add"), {"mm1": CONTRACT, "mm2": CONTRACT, "combine": ShardingOption(((), ()))}),
    "reassociate_reduce_scatter": (two_products("sub"), {"mm1": CONTRACT, "mm2": CONTRACT,
                                                         "combine": ShardingOption((("x",), ()))}),
    "decompose_all_reduce": (two_products("mul", "relu"), {"mm1": CONTRACT, "mm2": WHOLE, "combine": ShardingOption(((), ())),
                                                           "tail": ShardingOption(((), ()))}),
    "move_all_gather_down": (two_products("add", "tanh"), {"mm1": ROWS, "mm2": ROWS, "combine": ShardingOption((("x",), ())),
                                                           "tail": ShardingOption(((), ()))}),
}


def products_plan(graph: Graph, options: dict[str, ShardingOption]) -> Plan:
    return Plan(graph, MESH, options, {t: Sharding() for t in ("a", "b", "w1", "w2")})


@pytest.mark.parametrize("rewrite", sorted(CASES))
def test_each_rewrite_keeps_the_simulated_result(rewrite):
    program = partition(products_plan(*CASES[rewrite]))
    optimised, changes = optimize(program)
    assert rewrite in [c.rewrite for c in changes]
    for version in (program, optimised):
        verdict = simulate_program(version, seed=4)
        assert verdict.passed, verdict.summary()


def test_running_a_nonlinear_op_on_partial_values_is_caught_at_that_op():
    # Reassociate `add` legitimately, then pretend the op were `mul`: mul does not distribute
    # over the partial sums, so the value at `combine` is wrong on every device.
    optimised, _ = optimize(partition(products_plan(*CASES["reassociate_all_reduce"])))
    product = two_products("mul")
    body = tuple(dataclasses.replace(i, op=product.op_by_name["combine"])
                 if isinstance(i, LocalOp) and i.op.name == "combine" else i for i in optimised.body)
    verdict = simulate_program(dataclasses.replace(optimised, graph=product, body=body), seed=4)
    d = verdict.first_divergence
    assert not verdict.passed and (d.op, d.tensor, d.device) == ("combine", "s", (0, 0))
