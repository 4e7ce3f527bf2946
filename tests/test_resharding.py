"""The resharding planner: exact moves for uneven sizes, choice by price, partial values, the
step type, and the cost models' price."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from cost_models import bind
from autoshard.errors import ShardingError
from autoshard.mesh import Mesh
from autoshard.resharding import bytes_moved_price, plan_resharding
from autoshard.sharding import Sharding
from autoshard.sim import apply_resharding, assemble, distribute
from autoshard.sim import collectives as c

MESH = Mesh.of(x=2, y=3)
PRICE = bytes_moved_price(MESH)


def parse(text: str) -> Sharding:
    return Sharding.parse(text)


def simulate(mesh, array, source, target, plan):
    out = apply_resharding(distribute(array, mesh, source), mesh, plan)
    np.testing.assert_array_equal(assemble(out, mesh, target, array.shape), array)


def summary(plan):
    return [(s.kind, s.mesh_axes, {k: v for k, v in s.dims.items() if k != "transfers"}) for s in plan.steps]


def test_gather_of_the_minor_axis_only_where_exact():
    source, target = parse("[[x, y]]"), parse("[[x]]")
    # 12 over 6 then 2: shards of 2 concatenate in threes into shards of 6.
    plan = plan_resharding(MESH, (12,), 4, source, target, PRICE)
    assert summary(plan) == [("all_gather", ("y",), {"gather_axis": 0})]
    # 10 over 6 gives shards of 2 but 10 over 2 shards of 5: three 2s make 6, not 5.
    array = np.arange(10)
    wrong = c.all_gather(distribute(array, MESH, source), MESH, ("y",), 0)
    assert wrong[(0, 0)].tolist() == [0, 1, 2, 3, 4, 5]
    plan = plan_resharding(MESH, (10,), 4, source, target, PRICE)
    assert [s.kind for s in plan.steps] != ["all_gather"]
    simulate(MESH, array, source, target, plan)


def test_step_shapes_bytes_and_seconds():
    mesh = Mesh.of(x=4)
    plan = plan_resharding(mesh, (8, 3), 4, parse("[[x]]"), parse("[[]]"), bytes_moved_price(mesh))
    (step,) = plan.steps
    assert (step.in_local_shape, step.out_local_shape) == ((2, 3), (8, 3))
    assert step.bytes_per_device == 2 * 3 * 4
    assert step.seconds == pytest.approx(3 * 24 / 1e9)
    assert plan.seconds == step.seconds
    assert plan.max_bytes_received_per_device == 3 * 24


def test_the_cheapest_sequence_under_the_given_price_wins():
    array = np.arange(36).reshape(6, 6)
    source, target = parse("[[x], [y]]"), parse("[[y], [x]]")
    direct = plan_resharding(MESH, array.shape, 1, source, target, PRICE)
    assert [s.kind for s in direct.steps] == ["permute"]
    # Make direct exchanges dear (a many-to-many permute is priced as an all_to_all): the
    # planner turns to gathers and slices, and prices them right.
    dear_p2p = lambda kind, axes, b: PRICE(kind, axes, b) * (1000 if kind in ("send_recv", "all_to_all") else 1)  # noqa: E731
    plan = plan_resharding(MESH, array.shape, 1, source, target, dear_p2p)
    assert "permute" not in [s.kind for s in plan.steps]
    assert plan.seconds == pytest.approx(sum(dear_p2p(s.kind, s.mesh_axes, s.bytes_per_device) for s in plan.steps))
    assert plan.seconds < 1000 * direct.seconds
    simulate(MESH, array, source, target, plan)


def test_partial_sum_becomes_reduce_scatter_or_all_reduce():
    array = np.arange(36).reshape(6, 6)
    source = Sharding((("x",),), ("y",), "sum")
    plan = plan_resharding(MESH, array.shape, 4, source, parse("[[x], [y]]"), PRICE)
    assert summary(plan) == [("reduce_scatter", ("y",), {"reduction": "sum", "scatter_axis": 1})]
    simulate(MESH, array, source, parse("[[x], [y]]"), plan)
    plan = plan_resharding(MESH, array.shape, 4, source, parse("[[x]]"), PRICE)
    assert summary(plan) == [("all_reduce", ("y",), {"reduction": "sum"})]
    # keeping a partial axis: only the others are reduced
    both = Sharding((), ("x", "y"), "max")
    plan = plan_resharding(MESH, array.shape, 4, both, Sharding((), ("x",), "max"), PRICE)
    assert summary(plan) == [("all_reduce", ("y",), {"reduction": "max"})]
    simulate(MESH, array, both, Sharding((), ("x",), "max"), plan)


def test_partial_targets_the_source_cannot_reach():
    replicated = Sharding()
    with pytest.raises(ShardingError, match="sum-partial over \\['y'\\]"):
        plan_resharding(MESH, (6,), 4, replicated, Sharding((), ("y",), "sum"), PRICE)
    # a replicated value already is a max-partial one
    plan = plan_resharding(MESH, (6,), 4, replicated, Sharding((), ("y",), "max"), PRICE)
    assert plan.steps == ()
    simulate(MESH, np.arange(6), replicated, Sharding((), ("y",), "max"), plan)
    # a sum-partial value must be reduced before it can stand for a max-partial one
    source, target = Sharding((), ("y",), "sum"), Sharding((), ("y",), "max")
    plan = plan_resharding(MESH, (6,), 4, source, target, PRICE)
    assert summary(plan) == [("all_reduce", ("y",), {"reduction": "sum"})]
    simulate(MESH, np.arange(6), source, target, plan)


def test_explicit_offsets_on_either_side():
    array = np.arange(24).reshape(6, 4)
    uneven = Sharding((("y",),), dims_offsets=((0, 1, 5, 6),))
    for source, target in [(uneven, parse("[[y]]")), (parse("[[x], [y]]"), uneven), (uneven, parse("[[], [y]]"))]:
        plan = plan_resharding(MESH, array.shape, 4, source, target, PRICE)
        simulate(MESH, array, source, target, plan)


def test_steps_are_frozen_and_json_able():
    plan = plan_resharding(MESH, (6, 6), 2, parse("[[x], [y]]"), parse("[[y], [x]]"), PRICE)
    (step,) = plan.steps
    with pytest.raises(dataclasses.FrozenInstanceError):
        step.kind = "all_gather"
    with pytest.raises(TypeError):
        step.dims["transfers"] = ()
    data = json.loads(json.dumps(plan.to_json()))
    assert data["steps"][0]["kind"] == "permute"
    assert data["steps"][0]["before"] == {"split_axes": [["x"], ["y"]]}
    transfers = data["steps"][0]["dims"]["transfers"]
    assert len(transfers) == 16  # the seed's tile figure for this case
    assert {"source": [0, 0], "target": [0, 0], "source_box": [[0, 2], [0, 2]], "target_box": [[0, 2], [0, 2]]} in transfers
    assert data["max_bytes_received_per_device"] == 12
    assert (0, 0) not in {p[0] for p in step.pairs if p[1] == (0, 0)}


def test_with_the_cost_models_price():
    mesh = Mesh.of(dp=2, tp=4)
    topo = bind("dgx-h100", mesh.axis_names, mesh.shape)
    array = np.arange(64 * 8).reshape(64, 8)
    cases = [("[[dp], [tp]]", "[[tp], [dp]]"), ("[[dp, tp]]", "[[tp, dp]]"), ("[[tp]]", "[[]]"),
             ('{"split_axes": [["dp"]], "partial": {"kind": "sum", "axes": ["tp"]}}', "[[dp], [tp]]")]
    for source, target in cases:
        plan = plan_resharding(mesh, array.shape, 2, parse(source), parse(target), topo.collective_seconds)
        assert plan.seconds > 0
        simulate(mesh, array, parse(source), parse(target), plan)
