"""A mixture of experts routed by `top_k`, its combine matrix written by
`.at[tokens, experts].set(...)` (a scatter of single entries), imports with strict; planned on
dp=2,tp=4 with the tokens on dp and the experts on tp, the scatter writes each device's tokens
only, and XLA runs it with the unsharded result and exactly the plan's collectives."""

from __future__ import annotations

import jax
import numpy as np
from jax_models import EXPERTS, TOKENS, moe, moe_args
from proofs import jax_mesh, pinned_plan

import autoshard
from autoshard.frontends.jax import compare_collectives, compiled_collectives, planned_collectives, shard

MESH = autoshard.Mesh.parse("dp=2,tp=4")
PINS = {"x": [["dp"]], "params['w_in']": [["tp"]], "params['w_out']": [["tp"]]}


def test_a_routed_mixture_of_experts_runs_sharded_with_exactly_the_plans_collectives():
    args = moe_args()
    graph, hardware, result = pinned_plan(moe, args, MESH, PINS)
    # the combine matrix is written into [tokens * experts] rows, each device its tokens' rows
    (combine,) = [op for op in graph.ops if op.kind == "scatter"]
    assert graph.tensors[combine.outputs[0]].shape == (TOKENS * EXPERTS,)
    assert result.plan.options[combine.name].loop_axes[0] == ("dp",)
    assert autoshard.verify_plan(result.plan, hardware.collective_seconds).passed  # simulated device by device
    sharded = shard(moe, result, jax_mesh(MESH), price=hardware.collective_seconds)
    np.testing.assert_allclose(np.asarray(sharded(*args)), np.asarray(jax.jit(moe)(*args)), rtol=1e-5, atol=1e-5)
    compiled = compiled_collectives(sharded.lower(*args).compile().as_text())
    comparison = compare_collectives(planned_collectives(result.plan, hardware.collective_seconds), compiled)
    for kind in comparison:
        assert (kind.plan_count, kind.plan_bytes_per_device) == (kind.xla_count, kind.xla_bytes_per_device), \
            kind.to_json()
    # the router's logits gathered over dp (this plan runs top_k whole), the experts' sum reduced over tp
    assert {kind.kind: kind.plan_count for kind in comparison} == {"all-gather": 1, "all-reduce": 1}
