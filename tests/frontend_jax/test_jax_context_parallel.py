"""Context parallelism under XLA, in its all-gather realisation (Llama 3's): causal grouped-query
attention (8 query heads, 2 key/value heads) with q, k and v stored split over `cp` on the
sequence, planned on dp=2,cp=4. The plan splits the queries over `cp` and gathers the keys and
values whole for every use (no key split, no ring); XLA runs it under the plan's shardings on 8 CPU
devices with the unsharded output and gradients, and compiles exactly the plan's collectives: an
all-gather over `cp` for each of k and v at the key/value heads' bytes, and for the gradients the
gathered keys' and values' partial gradients reduce-scattered back over `cp`.

A JAX program has no fused attention op (its attention is the einsums and the softmax it is written
with), so its graph holds no attention option to split the key loop or to ring: the ring is proven
by the simulator and DTensor. A plan document naming a ring there is refused, naming the op."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from proofs import jax_mesh, pinned_plan

import autoshard
from autoshard.errors import InputError
from autoshard.frontends.jax import compare_collectives, compiled_collectives, planned_collectives, shard
from autoshard.planning.plan import plan_to_json
from autoshard.sharding import Sharding

BATCH, SEQ, HEADS, KV_HEADS, HEAD_DIM = 2, 32, 8, 2, 16
MESH = autoshard.Mesh.parse("dp=2,cp=4")
CP = MESH.axis_size("cp")
SEQUENCE_SPLIT = [["dp"], ["cp"]]  # [B, S, ...]: the batch over dp, the sequence over cp
KV_BLOCK_BYTES = BATCH // 2 * SEQ // CP * KV_HEADS * HEAD_DIM * 4  # one device's k (or v) block, f32


def attend(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
    """Causal grouped-query attention: q [B, S, H, D], k and v [B, S, KV, D] -> [B, S, H * D]."""
    b, s, _, d = q.shape
    q = q.reshape(b, s, KV_HEADS, HEADS // KV_HEADS, d)
    scores = jnp.einsum("bskgd,btkd->bkgst", q, k) * d ** -0.5
    causal = jnp.arange(s)[:, None] >= jnp.arange(s)[None, :]
    weights = jax.nn.softmax(jnp.where(causal, scores, -1e9), axis=-1)
    return jnp.einsum("bkgst,btkd->bskgd", weights, v).reshape(b, s, HEADS * d)


def attention_gradients(q: jax.Array, k: jax.Array, v: jax.Array, dy: jax.Array) -> tuple[jax.Array, ...]:
    """The gradients of q, k and v for the output's cotangent `dy` (jax.grad of <attend, dy>)."""
    return jax.grad(lambda q, k, v: jnp.sum(attend(q, k, v) * dy), argnums=(0, 1, 2))(q, k, v)


def attention_args() -> tuple[jax.Array, ...]:
    keys = jax.random.split(jax.random.key(7), 4)
    return (jax.random.normal(keys[0], (BATCH, SEQ, HEADS, HEAD_DIM)),
            jax.random.normal(keys[1], (BATCH, SEQ, KV_HEADS, HEAD_DIM)),
            jax.random.normal(keys[2], (BATCH, SEQ, KV_HEADS, HEAD_DIM)))


FUNCTIONS = {"forward": (attend, attention_args),
             "gradients": (attention_gradients,
                           lambda: (*attention_args(), jax.random.normal(jax.random.key(8),
                                                                         (BATCH, SEQ, HEADS * HEAD_DIM))))}


@functools.lru_cache(maxsize=None)
def planned(which: str) -> tuple[Any, ...]:
    f, make_args = FUNCTIONS[which]
    args = make_args()
    pins = {name: SEQUENCE_SPLIT for name in ("q", "k", "v", "dy")[:len(args)]}
    graph, hardware, result = pinned_plan(f, args, MESH, pins)
    return f, args, graph, hardware, result, shard(f, result, jax_mesh(MESH), price=hardware.collective_seconds)


def split_on(sharding: Sharding, dim: int) -> tuple[str, ...]:
    return tuple(sharding.split_axes[dim]) if dim < len(sharding.split_axes) else ()


@pytest.mark.parametrize("which", FUNCTIONS)
def test_the_plan_gathers_keys_and_values_and_splits_the_queries_over_cp(which):
    _, args, graph, hardware, result, _ = planned(which)
    plan = result.plan
    readers = [(op, i) for op in graph.ops for i, t in enumerate(op.inputs) if t in ("k", "v")]
    # the forward reads k for the scores and v for the output; the gradients read k for the scores
    # and for dq, and v for the weights' gradient (the output itself is not needed)
    assert len(readers) == (2 if which == "forward" else 3)
    for op, i in readers:
        # every use reads the keys and values whole on the sequence, the batch still over dp
        assert (split_on(plan.required(op, i), 0), split_on(plan.required(op, i), 1)) == (("dp",), ()), op.name
        # while the op's queries (or the rows of the scores) stay split over cp
        assert any("cp" in axes for axes in plan.options[op.name].loop_axes), (op.name, plan.options[op.name])
    assert all(option.ring is None for option in plan.options.values())
    # no key split: nothing the forward makes is a partial max or sum over cp (the gradients' sums
    # over the gathered keys are, and are reduce-scattered below)
    if which == "forward":
        assert not any("cp" in plan.produced(t).partial_axes for t in graph.producers)
    planned_kinds = {(c.kind, c.name, c.group_size, c.bytes_per_device)
                     for c in planned_collectives(plan, hardware.collective_seconds) if c.kind == "all-gather"}
    assert planned_kinds == {("all-gather", name, CP, KV_BLOCK_BYTES) for name in ("k", "v")}
    # the plan's program, simulated device by device, computes the graph's values
    assert autoshard.verify_plan(plan, hardware.collective_seconds).passed


@pytest.mark.parametrize("which", FUNCTIONS)
def test_xla_runs_the_plan_to_the_unsharded_values(which):
    f, args, *_, sharded = planned(which)
    specs = sharded.shardings(*args)
    assert jax.tree_util.tree_leaves(specs.in_specs) == [P("dp", "cp")] * len(args)
    got, want = jax.tree_util.tree_leaves(sharded(*args)), jax.tree_util.tree_leaves(jax.jit(f)(*args))
    assert len(got) == (1 if which == "forward" else 3)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5)
    # the attention was really computed sharded: its result is stored over the mesh, not replicated
    assert all(g.sharding.spec == P("dp", "cp") for g in got)


@pytest.mark.parametrize("which", FUNCTIONS)
def test_xla_compiles_exactly_the_plans_collectives_an_all_gather_over_cp_for_k_and_v(which):
    _, args, _, hardware, result, sharded = planned(which)
    compiled = compiled_collectives(sharded.lower(*args).compile().as_text())
    gathers = [c for c in compiled if c.kind == "all-gather"]
    # two gathers of a k/v block over the 4 devices of cp (dp has 2), at the kv heads' bytes
    assert [(c.group_size, c.bytes_per_device) for c in gathers] == [(CP, KV_BLOCK_BYTES)] * 2
    assert all(c.result_type.startswith(f"f32[{BATCH // 2},{SEQ},{KV_HEADS},{HEAD_DIM}]") for c in gathers)
    comparison = compare_collectives(planned_collectives(result.plan, hardware.collective_seconds), compiled)
    for kind in comparison:
        assert (kind.plan_count, kind.plan_bytes_per_device) == (kind.xla_count, kind.xla_bytes_per_device), \
            kind.to_json()
    counts = {kind.kind: kind.plan_count for kind in comparison}
    # the gradients of the gathered k and v are partial over cp, reduce-scattered back to their blocks
    assert counts == ({"all-gather": 2} if which == "forward" else {"all-gather": 2, "reduce-scatter": 2})


def test_a_plan_naming_a_ring_is_refused_naming_the_op():
    _, args, graph, _, result, _ = planned("forward")
    scores = next(op for op in graph.ops if "k" in op.inputs)
    document = plan_to_json(result.plan)
    document["ops"][scores.name]["ring"] = "cp"
    with pytest.raises(InputError, match=rf"{scores.name}.*cannot take a ring; only attention"):
        shard(attend, document, jax_mesh(MESH)).shardings(*args)
