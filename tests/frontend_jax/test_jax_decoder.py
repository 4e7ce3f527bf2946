"""A MaxText-style decoder (an embedding lookup with `jnp.take`, RMSNorm, rotary positions,
grouped-query attention, SwiGLU, the blocks' parameters stacked on a leading layer axis and run
by `jax.lax.scan`, logits) imports with strict (no opaque op), each scanned layer a layer of the
graph; planned on dp=2,tp=4 with Megatron pins on the stacked weights and a vocabulary-parallel
embedding and head, XLA runs it under the plan with the unsharded logits and exactly the plan's
collectives. Its training step (`jax.grad` through the scan) imports with strict too, and runs
under its plan with jax's update and exactly the plan's collectives: each weight the plan gathers
once for the forward and backward reads is sliced locally where the update reads it split."""

from __future__ import annotations

import functools
import json
import textwrap
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from jax_models import LAYERS, decoder, decoder_args, llama_args, llama_block
from proofs import jax_mesh, pinned_plan, replicated_peak_bytes
from test_jax_import import run_graph

import autoshard
from autoshard.cli.main import main
from autoshard.frontends.jax import compare_collectives, compiled_collectives, planned_collectives, shard
from autoshard.frontends.jax.importer import import_function
from autoshard.graph.schema import graph_from_json

MESH = autoshard.Mesh.parse("dp=2,tp=4")
COLUMN_PARALLEL = ("wq", "wk", "wv", "w_gate", "w_up")  # stacked [L, in, out], split on out
ROW_PARALLEL = ("wo", "w_down")  # stacked [L, in, out], split on in
PINS = {"ids": [["dp"]], "params['embed']": [["tp"], []], "params['lm_head']": [[], ["tp"]],
        **{f"params['layers']['{w}']": [[], [], ["tp"]] for w in COLUMN_PARALLEL},
        **{f"params['layers']['{w}']": [[], ["tp"]] for w in ROW_PARALLEL}}


@functools.lru_cache(maxsize=None)
def planned(f=decoder):
    args = decoder_args()
    graph, hardware, result = pinned_plan(f, args, MESH, PINS)
    return args, graph, hardware, result, shard(f, result, jax_mesh(MESH), price=hardware.collective_seconds)


def test_the_decoder_imports_strict_with_each_scanned_layer_a_layer():
    args = decoder_args()
    graph = graph_from_json(import_function(decoder, args, strict=True).document)
    assert "opaque" not in {op.kind for op in graph.ops}
    assert [op.kind for op in graph.ops if op.inputs[-1:] == ("params['embed']",)] == ["embedding"]
    by_layer = {}
    for op in graph.ops:
        by_layer.setdefault(op.layer, []).append(op)
    assert set(by_layer) == set(range(LAYERS)) | {None}
    # the iteration's scope, under which jnp.einsum names its own
    assert all(op.module.split(".")[:2] == ["scan", str(op.layer)] for i in range(LAYERS) for op in by_layer[i])
    # each layer computes one block: its FLOPs are the block's, none lost in an opaque op
    block = graph_from_json(import_function(llama_block, llama_args(), strict=True).document)
    block_flops = sum(op.flops() for op in block.ops)
    assert [sum(op.flops() for op in by_layer[i]) for i in range(LAYERS)] == [block_flops] * LAYERS
    assert Counter(op.kind for op in by_layer[0])["dot_general"] == Counter(op.kind for op in block.ops)["dot_general"]


def test_the_import_command_takes_the_decoder_strict(tmp_path, capsys):
    source = tmp_path / "model.py"
    source.write_text(textwrap.dedent("""
        from jax_models import decoder, decoder_args

        def make():
            return decoder, decoder_args()
    """))
    out = tmp_path / "graph.json"
    assert main(["import", "jax", f"{source}:make", "-o", str(out), "--strict"]) == 0, capsys.readouterr().err
    graph = graph_from_json(json.loads(out.read_text()))
    assert "opaque" not in {op.kind for op in graph.ops}
    assert {op.layer for op in graph.ops} == set(range(LAYERS)) | {None}


def test_the_plan_shards_the_stacked_weights_keeping_the_layer_axis_whole():
    args, graph, hardware, result, sharded = planned()
    params, ids = sharded.shardings(*args).in_specs
    assert ids == P("dp")
    assert {w: params["layers"][w] for w in COLUMN_PARALLEL + ROW_PARALLEL} == {
        **{w: P(None, None, "tp") for w in COLUMN_PARALLEL}, **{w: P(None, "tp") for w in ROW_PARALLEL}}
    assert params["embed"] == P("tp") and params["lm_head"] == P(None, "tp")
    # the norms' stacked gammas [L, D] are the solver's to place: no layer's slice is split off
    assert all(not spec or spec[0] is None for spec in params["layers"].values())
    assert result.report.peak_memory_bytes < replicated_peak_bytes(graph, MESH, hardware)
    # the plan's program, simulated device by device, computes the graph's values
    assert autoshard.verify_plan(result.plan, hardware.collective_seconds).passed


def test_the_sharded_decoder_gives_the_unsharded_logits():
    args, _, _, _, sharded = planned()
    logits = sharded(*args)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(jax.jit(decoder)(*args)), rtol=1e-5, atol=2e-5)
    assert logits.sharding.mesh.shape == {"dp": 2, "tp": 4}


def assert_xla_compiles_exactly_the_plans_collectives(args, hardware, result, sharded):
    compiled = compiled_collectives(sharded.lower(*args).compile().as_text())
    comparison = compare_collectives(planned_collectives(result.plan, hardware.collective_seconds), compiled)
    assert comparison, "a tensor-parallel decoder communicates"
    for kind in comparison:
        assert (kind.plan_count, kind.plan_bytes_per_device) == (kind.xla_count, kind.xla_bytes_per_device), \
            kind.to_json()
    return {kind.kind: kind.plan_count for kind in comparison}


def test_xla_compiles_exactly_the_plans_collectives():
    args, _, hardware, result, sharded = planned()
    assert assert_xla_compiles_exactly_the_plans_collectives(args, hardware, result, sharded) == {"all-reduce": 5}


def training_step(params, ids):
    """Next-token cross-entropy's gradient (through the scan) applied to the parameters."""
    def loss(params):
        logits = jax.nn.log_softmax(decoder(params, ids))
        return -jnp.mean(jnp.take_along_axis(logits, jnp.roll(ids, -1, axis=1)[..., None], axis=-1))

    return jax.tree_util.tree_map(lambda w, g: w - 0.1 * g, params, jax.grad(loss)(params))


def test_the_decoders_training_step_imports_strict_and_computes_the_update():
    args = decoder_args()
    with pytest.warns(UserWarning, match="layers are not kept"):  # a jax.grad program declares no backward
        imported = import_function(training_step, args, strict=True)
    graph, results = run_graph(imported, args)
    assert {"scatter_add", "embedding", "one_hot"} <= {op.kind for op in graph.ops}
    for got, want in zip(results, jax.tree_util.tree_leaves(training_step(*args)), strict=True):
        np.testing.assert_allclose(got, np.asarray(want), rtol=1e-4, atol=1e-5)


def test_the_training_step_runs_under_its_plan_with_exactly_its_collectives():
    with pytest.warns(UserWarning, match="layers are not kept"):  # imported again by shard, at the call
        args, _, hardware, result, sharded = planned(training_step)
        updated = jax.tree_util.tree_leaves(sharded(*args))
    for got, want in zip(updated, jax.tree_util.tree_leaves(training_step(*args)), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    # the stacked weights, stored split, are delivered gathered for the forward and backward
    # slices; the update reads them split again from that copy, a local slice
    specs = sharded.shardings(*args)
    assert {specs.imported.tensors[v] for v, spec in specs.delivered.items() if spec == P()} >= {
        f"params['layers']['{w}']" for w in COLUMN_PARALLEL + ROW_PARALLEL}
    assert autoshard.verify_plan(result.plan, hardware.collective_seconds).passed
    kinds = assert_xla_compiles_exactly_the_plans_collectives(args, hardware, result, sharded)
    assert "all-to-all" not in kinds and kinds["all-gather"] >= len(COLUMN_PARALLEL + ROW_PARALLEL)
