"""plan.json's `partition_specs`: each value's sharding as a JAX PartitionSpec, and a reason for
each value a PartitionSpec cannot express (partial, explicit offsets, uneven at a jit boundary)."""

from __future__ import annotations

from autoshard.delivery.partition_specs import partition_spec, plan_partition_specs, spec_problem
from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.planning.options import ShardingOption as O
from autoshard.planning.plan import Plan
from autoshard.sharding import Sharding as S
from support.graphs import MLP


def test_split_axes_read_as_a_partition_spec():
    assert partition_spec(S((("dp", "tp"), (), ("x",)))) == [["dp", "tp"], None, "x"]
    assert partition_spec(S(((), ("tp",), ()))) == [None, "tp"]
    assert partition_spec(S()) == []


def test_what_a_partition_spec_cannot_say_is_named():
    mesh = Mesh.of(dp=2, tp=4)
    assert "partial (sum) over ['tp']" in spec_problem(S((("dp",),), ("tp",)), mesh, (8, 8), False)
    assert "sharded_dims_offsets" in spec_problem(S((("dp",),), dims_offsets=((0, 3, 8),)), mesh, (8, 8), False)
    assert spec_problem(S(((), ("tp",))), mesh, (8, 6), False) is None  # XLA pads an uneven intermediate
    assert "dim 1 of size 6 over 4" in spec_problem(S(((), ("tp",))), mesh, (8, 6), True)


def test_a_megatron_mlp_plan_gives_every_value_its_spec():
    mesh = Mesh.of(dp=2, tp=4)
    graph = graph_from_json(MLP)
    # fc1 splits its n loop over tp, fc2 its k loop: fc2's result is partial until delivered
    options = {"fc1": O((("dp",), ("tp",), ())), "act": O((("dp",), ("tp",))), "fc2": O((("dp",), (), ("tp",)))}
    storage = {"x": S((("dp",),)), "w1": S(((), ("tp",))), "w2": S((("tp",),))}
    specs = plan_partition_specs(Plan(graph, mesh, options, storage))
    assert specs["inputs"] == {"x": ["dp"], "w1": [None, "tp"], "w2": ["tp"]}
    assert specs["intermediates"] == {"h": ["dp", "tp"], "a": ["dp", "tp"]}
    assert specs["outputs"] == {"y": ["dp"]}
    assert list(specs["not_expressible"]) == ["intermediates/y"]
