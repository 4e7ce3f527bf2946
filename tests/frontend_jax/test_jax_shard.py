"""A plan back in JAX: PartitionSpecs shaped like the user's arguments and results, a plan read back
from plan.json, meshes of either axis type, arrays not yet placed, and the values JAX cannot
place as planned refused with their names."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from jax_models import mlp, mlp_args
from proofs import TOPOLOGY, jax_mesh

import autoshard
from autoshard.errors import InputError
from autoshard.frontends.jax import from_function, partition_specs, shard
from autoshard.graph.schema import graph_from_json

MESH = autoshard.Mesh.parse("dp=2,tp=4")
PINS = {"params['w1']": [[], ["tp"]], "params['w2']": [["tp"]], "x": [["dp"]]}


def planned(args, pins=PINS, mesh=MESH):
    document = from_function(mlp, *args)
    document["constraints"] += [{"tensor": t, "split_axes": s} for t, s in pins.items()]
    hardware = autoshard.bind_hardware(TOPOLOGY, mesh)
    result = autoshard.make_plan(graph_from_json(document, mesh), mesh, hardware, autoshard.SolveSettings(deterministic=True))
    return result, hardware


@pytest.fixture(scope="module")
def plan_and_args():
    args = mlp_args()
    result, hardware = planned(args)
    return result, hardware, args


def test_specs_are_pytrees_shaped_like_the_arguments_and_results(plan_and_args):
    result, _, args = plan_and_args
    specs = partition_specs(mlp, result, *args)
    assert specs.in_specs == ({"w1": P(None, "tp"), "w2": P("tp")}, P("dp"))
    assert specs.out_specs == result_spec(result)
    # the hidden layer, made by the first dot_general, is constrained where it is made
    (hidden,) = [op.outputs[0] for op in specs.plan.graph.ops if op.kind == "dot_general" and "params['w1']" in op.inputs]
    assert specs.constraints[hidden] == P("dp", "tp")
    mesh = jax_mesh(MESH, "Auto")
    (params, x), out = specs.named(mesh)
    assert params["w1"] == jax.sharding.NamedSharding(mesh, P(None, "tp")) and x.spec == P("dp") and out.mesh == mesh


def result_spec(result):
    (output,) = result.plan.graph.outputs
    axes = result.plan.final(output).split_axes
    return P(*(a[0] if len(a) == 1 else (a or None) for a in axes))


def test_a_partial_sum_gets_no_spec_where_it_is_made_only_where_it_is_reduced(plan_and_args, tmp_path):
    result, hardware, args = plan_and_args
    specs = partition_specs(mlp, result, *args)
    graph = specs.plan.graph
    (product,) = [op.outputs[0] for op in graph.ops if op.kind == "dot_general" and "params['w2']" in op.inputs]
    assert specs.plan.produced(product).partial_axes == ("tp",)
    assert product not in specs.constraints
    document = autoshard.deliver(result, hardware, TOPOLOGY).document
    assert "partial (sum) over ['tp']" in document["partition_specs"]["not_expressible"][f"intermediates/{product}"]
    assert document["partition_specs"]["inputs"]["params['w1']"] == [None, "tp"]


@pytest.mark.parametrize("axis_type", ["Explicit", "Auto"])
def test_a_plan_read_back_from_plan_json_runs_on_either_axis_type(plan_and_args, tmp_path, axis_type):
    result, hardware, args = plan_and_args
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(autoshard.deliver(result, hardware, TOPOLOGY).document))
    sharded = shard(mlp, json.loads(path.read_text()), jax_mesh(MESH, axis_type))
    placed_nowhere = jax.tree_util.tree_map(np.asarray, args)
    out = sharded(*placed_nowhere)
    np.testing.assert_allclose(np.asarray(out), np.asarray(mlp(*args)), rtol=1e-5, atol=1e-5)
    assert out.sharding.spec == result_spec(result)
    assert out.sharding.mesh.shape == {"dp": 2, "tp": 4}


def test_a_mesh_unlike_the_plans_is_refused(plan_and_args):
    result, _, _ = plan_and_args
    with pytest.raises(InputError, match=r"mesh: the plan is for mesh dp=2,tp=4; got tp=4,dp=2"):
        shard(mlp, result, jax.make_mesh((4, 2), ("tp", "dp")))


def test_an_uneven_argument_is_refused_naming_it():
    args = mlp_args(batch=6)  # 6 rows, pinned below to split over tp=4
    mesh = autoshard.Mesh.parse("tp=4,dp=2")
    result, _ = planned(args, {"x": [["tp"]], "params['w1']": [[], ["dp"]]}, mesh)
    with pytest.raises(InputError) as caught:
        shard(mlp, result, jax_mesh(mesh))(*args)
    assert [str(p) for p in caught.value.problems] == [
        "input x: uneven (dim 0 of size 6 over 4): jit arguments and results must divide evenly"]


def test_a_hand_edited_plan_json_is_refused_naming_the_field(plan_and_args):
    """`shard` reads a plan document through the same contract as the CLI and the service."""
    result, hardware, args = plan_and_args
    document = autoshard.deliver(result, hardware, TOPOLOGY).document
    name = next(iter(document["ops"]))
    del document["ops"][name]
    document["tensors"] = None
    with pytest.raises(InputError) as caught:
        shard(mlp, document, jax_mesh(MESH))(*args)
    assert {f"/ops/{name}", "/tensors"} <= {p.where for p in caught.value.problems}
