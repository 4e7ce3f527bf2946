"""A mixture of experts written in JAX as GShard's dropping dispatch (MaxText's form: `top_k`, a
one-hot of the picks, a running count of each expert's load per group, slots past the capacity
dropped, einsums to and from [E, G, C, H]) imports with strict as routed computation: its FLOPs
are the routed count at top-k × capacity factor, not the dense one. Planned on ep=4 with the
tokens' groups and the experts over ep, the tokens reach their experts and come back by
all-to-alls, and XLA runs the plan with the unsharded result and those two all-to-alls.

The same dispatch written with `scatter` (each pick into its expert's next free row of a buffer
[E * C, H], overflow dropped) and `gather` (each pick's output read back from its row) is routed as
written too; with no group dim to trade for the expert dim, a plan over ep gathers the tokens and
reduce-scatters the picks' outputs instead."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from proofs import jax_mesh, pinned_plan

import autoshard
from autoshard.frontends.jax import compare_collectives, compiled_collectives, planned_collectives, shard

GROUPS, GROUP_SIZE, HIDDEN, FFN, EXPERTS, TOP_K, CAPACITY_FACTOR = 4, 64, 2048, 1024, 8, 2, 2.0
SLOTS = math.ceil(TOP_K * GROUP_SIZE * CAPACITY_FACTOR / EXPERTS)


def gshard_moe(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    """x [G, S, H] through the router, GShard's dispatch to SLOTS per expert and group (first
    choices before second ones, overflow dropped), the experts and the weighted combine."""
    probs = jax.nn.softmax(jnp.einsum("gsh,he->gse", x, params["router"]), axis=-1)
    weights, experts = jax.lax.top_k(probs, TOP_K)
    weights = weights / weights.sum(-1, keepdims=True)
    hot = jax.nn.one_hot(experts, EXPERTS, dtype=jnp.int32)  # [G, S, K, E]
    picks = hot.transpose(0, 2, 1, 3).reshape(GROUPS, TOP_K * GROUP_SIZE, EXPERTS)
    rank = jnp.cumsum(picks, axis=1) * picks  # a pick's slot, from 1; 0 where not picked
    slots = jax.nn.one_hot(rank - 1, SLOTS, dtype=x.dtype).reshape(GROUPS, TOP_K, GROUP_SIZE, EXPERTS, SLOTS)
    combine = jnp.einsum("gsk,gksec->gsec", weights, slots)
    xe = jnp.einsum("gsec,gsh->egch", slots.sum(1), x)
    ye = jnp.einsum("egcf,efh->egch", jax.nn.silu(jnp.einsum("egch,ehf->egcf", xe, params["w_in"])), params["w_out"])
    return jnp.einsum("gsec,egch->gsh", combine, ye)


def moe_args() -> tuple[dict[str, jax.Array], jax.Array]:
    k = jax.random.split(jax.random.key(11), 4)
    params = {"router": jax.random.normal(k[0], (HIDDEN, EXPERTS)),
              "w_in": jax.random.normal(k[1], (EXPERTS, HIDDEN, FFN)) * HIDDEN ** -0.5,
              "w_out": jax.random.normal(k[2], (EXPERTS, FFN, HIDDEN)) * FFN ** -0.5}
    return params, jax.random.normal(k[3], (GROUPS, GROUP_SIZE, HIDDEN))


def test_a_gshard_moe_in_jax_costs_the_routed_count_and_reaches_its_experts_by_all_to_alls():
    args = moe_args()
    mesh = autoshard.Mesh.parse("ep=4")
    dispatched = "dot_general.2"  # [G, H, E, C]: the tokens in their slots, still by group
    pins = {"x": [["ep"]], "params['w_in']": [["ep"]], "params['w_out']": [["ep"]], dispatched: [["ep"]]}
    graph, hardware, result = pinned_plan(gshard_moe, args, mesh, pins)

    tokens = GROUPS * GROUP_SIZE
    routed = 2 * tokens * HIDDEN * EXPERTS + tokens * TOP_K * CAPACITY_FACTOR * 2 * 2 * HIDDEN * FFN
    assert abs(sum(op.flops() for op in graph.ops) / routed - 1) < 0.10
    experts = [op for op in graph.ops if {"params['w_in']", "params['w_out']"} & set(op.inputs)]
    assert len(experts) == 2 and all(graph.tensors[op.outputs[0]].shape[0] == EXPERTS for op in experts)
    for op in experts:  # [E, G, C, ...]: the expert loop over ep
        assert result.plan.options[op.name].loop_axes[0] == ("ep",), op.name

    kinds = {(r["tensor"], r["consumer"]): [s["kind"] for s in r["steps"]]
             for r in result.report.to_json()["reshardings"] if r["steps"]}
    assert kinds == {(dispatched, "transpose.1"): ["all_to_all"],  # tokens to their experts
                     ("dot_general.4", "dot_general.5"): ["all_to_all"]}  # and their outputs back by group
    assert autoshard.verify_plan(result.plan, hardware.collective_seconds).passed

    sharded = shard(gshard_moe, result, jax_mesh(mesh), price=hardware.collective_seconds)
    np.testing.assert_allclose(np.asarray(sharded(*args)), np.asarray(jax.jit(gshard_moe)(*args)), rtol=1e-4, atol=1e-4)
    compiled = compiled_collectives(sharded.lower(*args).compile().as_text())
    counts = {c.kind: (c.plan_count, c.xla_count) for c in
              compare_collectives(planned_collectives(result.plan, hardware.collective_seconds), compiled)}
    assert counts["all-to-all"] == (2, 2)


SCATTER_TOKENS, SCATTER_HIDDEN, SCATTER_FFN = 64, 256, 128
SCATTER_SLOTS = math.ceil(TOP_K * SCATTER_TOKENS * CAPACITY_FACTOR / EXPERTS)


def scatter_moe(params: dict[str, jax.Array], x: jax.Array) -> jax.Array:
    """x [T, H]: each pick written into its expert's next free row of a buffer [E * C, H] (picks
    past C dropped), the experts on [E, C, H], each pick's output read back from its row, weighed."""
    tokens, hidden = x.shape
    weights, experts = jax.lax.top_k(jax.nn.softmax(x @ params["router"], axis=-1), TOP_K)
    hot = jax.nn.one_hot(experts.T.reshape(-1), EXPERTS, dtype=jnp.int32)  # first choices first
    slot = ((jnp.cumsum(hot, axis=0) * hot).sum(-1) - 1).reshape(TOP_K, tokens).T
    row = jnp.where(slot < SCATTER_SLOTS, experts * SCATTER_SLOTS + slot, EXPERTS * SCATTER_SLOTS)
    picks = jnp.broadcast_to(x[:, None, :], (tokens, TOP_K, hidden)).reshape(-1, hidden)
    buffer = jnp.zeros((EXPERTS * SCATTER_SLOTS, hidden), x.dtype).at[row.reshape(-1)].set(picks, mode="drop")
    h = jax.nn.silu(jnp.einsum("ech,ehf->ecf", buffer.reshape(EXPERTS, SCATTER_SLOTS, hidden), params["w_in"]))
    ye = jnp.einsum("ecf,efh->ech", h, params["w_out"]).reshape(EXPERTS * SCATTER_SLOTS, hidden)
    return jnp.einsum("tk,tkh->th", weights, jnp.take(ye, row, axis=0, mode="fill", fill_value=0))


def test_a_scatter_and_gather_moe_in_jax_is_routed_and_its_experts_split_over_an_axis():
    k = jax.random.split(jax.random.key(12), 4)
    params = {"router": jax.random.normal(k[0], (SCATTER_HIDDEN, EXPERTS)),
              "w_in": jax.random.normal(k[1], (EXPERTS, SCATTER_HIDDEN, SCATTER_FFN)) * SCATTER_HIDDEN ** -0.5,
              "w_out": jax.random.normal(k[2], (EXPERTS, SCATTER_FFN, SCATTER_HIDDEN)) * SCATTER_FFN ** -0.5}
    args = (params, jax.random.normal(k[3], (SCATTER_TOKENS, SCATTER_HIDDEN)))
    mesh = autoshard.Mesh.parse("ep=4")
    pins = {"x": [["ep"]], "params['w_in']": [["ep"]], "params['w_out']": [["ep"]]}
    graph, hardware, result = pinned_plan(scatter_moe, args, mesh, pins)

    routed = 2 * SCATTER_TOKENS * SCATTER_HIDDEN * EXPERTS \
        + SCATTER_TOKENS * TOP_K * CAPACITY_FACTOR * 2 * 2 * SCATTER_HIDDEN * SCATTER_FFN
    assert abs(sum(op.flops() for op in graph.ops) / routed - 1) < 0.10
    (scatter,) = [op for op in graph.ops if op.kind == "scatter"]
    assert result.plan.options[scatter.name].loop_axes[0] == ("ep",)  # each device writes its experts' rows
    kinds = {(r["tensor"], r["consumer"]): [s["kind"] for s in r["steps"]]
             for r in result.report.to_json()["reshardings"] if r["steps"]}
    assert kinds[("x", "dot_general")] == ["all_gather"]  # every device routes every token
    assert ["reduce_scatter"] in kinds.values()  # each pick's output summed from its expert's device
    assert autoshard.verify_plan(result.plan, hardware.collective_seconds).passed
    sharded = shard(scatter_moe, result, jax_mesh(mesh), price=hardware.collective_seconds)
    np.testing.assert_allclose(np.asarray(sharded(*args)), np.asarray(jax.jit(scatter_moe)(*args)),
                               rtol=1e-5, atol=1e-5)
