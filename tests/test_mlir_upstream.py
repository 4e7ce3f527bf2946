"""Our collectives against upstream LLVM 22's: the annotated `shard` module of a plan goes through
`sharding-propagation` and `shard-partition`, and the collectives of its output are compared with
those of our partitioned module, both priced by `bytes_moved_price` (ring volumes at 1 GB/s).

| plan (MLP 8x16 -> 32 -> 16, mesh dp=2,tp=4) | upstream | ours | cheaper |
| --- | --- | --- | --- |
| Megatron (fc1 column-, fc2 row-split) | all_reduce | all_reduce | equal |
| data parallel, weights stored split over tp | 2 all_gathers | 2 all_gathers | equal |
| fc1 K-split, fc2 M-split | all_reduce, all_slice, all_to_all | reduce_scatter, all_to_all | ours, 1.8x |
| Megatron, output pinned [[], [tp]] | all_reduce, all_slice (wrong layout) | reduce_scatter, all_gather | ours |

Where they differ: upstream materialises a partial value with an all_reduce and then slices it,
while a reduce_scatter lands on the slice directly for half the traffic. And LLVM 22's resharding
applies one pattern to one dim: [[dp]] -> [[], [tp]] only slices dim 1 and leaves dim 0 split,
returning a 4x4 shard where the pinned layout has 8x4 (a later upstream change reshards dim by dim).
"""

from __future__ import annotations

import pytest

from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.mlir import collectives, emit_annotated, emit_partitioned, upstream_partition
from autoshard.mlir.toolchain import CollectiveUse
from autoshard.planning.options import ShardingOption
from autoshard.planning.plan import Plan
from autoshard.resharding import bytes_moved_price
from autoshard.sharding import Sharding
from autoshard.spmd.program import partition
from support.graphs import MLP, megatron

O, S = ShardingOption, Sharding
MESH = Mesh.of(dp=2, tp=4)
PRICE = bytes_moved_price(MESH)


def both(plan: Plan) -> tuple[str, str]:
    """(upstream's partitioned module, ours), both with local arguments."""
    return upstream_partition(emit_annotated(plan, "shard")), emit_partitioned(plan, "shard")


def summary(uses: list[CollectiveUse]) -> list[tuple[str, tuple[int, ...], tuple[int, ...], tuple[int, ...]]]:
    return [(c.kind, c.mesh_axes, c.in_shape, c.out_shape) for c in uses]


def seconds(uses: list[CollectiveUse]) -> float:
    return sum(c.seconds(MESH, PRICE, 4) for c in uses)


def plan_with(options: dict[str, O], storage: dict[str, S], doc: dict = MLP) -> Plan:
    return Plan(graph_from_json(doc, MESH), MESH, options, storage)


def test_megatron_mlp_upstream_and_ours_agree():
    upstream, ours = both(megatron(MESH))
    assert summary(collectives(upstream)) == summary(collectives(ours)) == [("all_reduce", (1,), (4, 16), (4, 16))]
    # same local signature: arguments already partitioned
    assert "(%arg0: tensor<4x16xf32>, %arg1: tensor<16x8xf32>, %arg2: tensor<8x16xf32>) -> tensor<4x16xf32>" in upstream
    assert seconds(collectives(ours)) == pytest.approx(partition(megatron(MESH)).communication_seconds())


def test_data_parallel_with_split_stored_weights_gathers_both_weights_in_each():
    plan = plan_with({"fc1": O((("dp",), (), ())), "act": O((("dp",), ())), "fc2": O((("dp",), (), ()))},
                     {"x": S((("dp",),)), "w1": S((("tp",),)), "w2": S((("tp",),))})
    upstream, ours = both(plan)
    assert sorted(summary(collectives(upstream))) == sorted(summary(collectives(ours))) == [
        ("all_gather", (1,), (4, 32), (16, 32)), ("all_gather", (1,), (8, 16), (32, 16))]


def test_a_reduce_scatter_beats_upstreams_all_reduce_then_slice():
    plan = plan_with({"fc1": O(((), (), ("tp",))), "act": O(((), ("tp",))), "fc2": O((("tp",), (), ()))},
                     {"x": S(((), ("tp",))), "w1": S((("tp",),)), "w2": S()})
    upstream, ours = both(plan)
    assert [c.kind for c in collectives(upstream)] == ["all_reduce", "all_slice", "all_to_all"]
    assert [c.kind for c in collectives(ours)] == ["reduce_scatter", "all_to_all"]
    # the all_reduce moves 2 * 3/4 of the 8x32 f32 value per device, the reduce_scatter 3/4 of it
    assert seconds(collectives(upstream)) == pytest.approx(1.728e-6)
    assert seconds(collectives(ours)) == pytest.approx(0.96e-6)


def test_upstream_22_reshards_only_one_dim_of_a_two_dim_change():
    doc = dict(MLP, constraints=[{"tensor": "y", "split_axes": [[], ["tp"]]}])
    plan = plan_with(megatron(MESH).options, megatron(MESH).storage, doc)
    upstream, ours = both(plan)
    assert [c.kind for c in collectives(upstream)] == ["all_reduce", "all_slice"]
    signature = next(line for line in upstream.splitlines() if "func.func" in line)
    assert signature.endswith("-> tensor<4x4xf32> {")  # dim 0 still split over dp: not [[], [tp]]
    assert summary(collectives(ours)) == [("reduce_scatter", (1,), (4, 16), (4, 4)), ("all_gather", (0,), (4, 4), (8, 4))]
    assert next(line for line in ours.splitlines() if "func.func" in line).endswith("-> tensor<8x4xf32> {")
    assert seconds(collectives(ours)) < seconds(collectives(upstream))
