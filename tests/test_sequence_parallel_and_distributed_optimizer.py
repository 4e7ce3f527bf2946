"""Two of Megatron-LM's memory savings, left to the solver on a tensor-parallel mesh whose
weights are pinned column- and row-parallel: the distributed optimizer (master weights and Adam
moments split over the data replicas) and sequence parallelism (the norms and residuals between
the tensor-parallel blocks split on the sequence over the tensor axis). Neither is forced; the
tests show the solver choosing each where it pays, and not where it does not."""

from __future__ import annotations

from typing import Any

import pytest

import autoshard
from autoshard.graph.model import Graph
from autoshard.graph.schema import graph_from_json
from autoshard.models.gpt import GPTConfig, gpt
from autoshard.models.layouts import layout_constraints
from autoshard.models.mlp import MLPConfig, mlp
from autoshard.models.training import training_precision
from autoshard.planning.options import ShardingOption
from autoshard.planning.plan import Plan
from autoshard.planning.report import estimate
from autoshard.planning.roles import plan_roles
from autoshard.sharding import Sharding

MiB = 2 ** 20


def megatron_mlp(batch: int, hidden: int, ffn: int) -> Graph:
    """A bf16-mixed MLP step with w1 column-parallel and w2 row-parallel over `tp` and the batch
    over `dp`; the master weights and moments are free."""
    with training_precision("bf16-mixed"):
        document = mlp(MLPConfig(layers=2, batch=batch, hidden=hidden, ffn=ffn), training=True)
    pins: list[dict[str, Any]] = []
    for name, tensor in document["tensors"].items():
        if tensor.get("role") == "parameter" and not name.startswith("adam."):
            pins.append({"tensor": name, "split_axes": [[], ["tp"]] if name.endswith("w1") else [["tp"], []],
                         "required": True})
        elif tensor.get("batch_dim") == 0:
            pins.append({"tensor": name, "split_axes": [["dp"], []], "required": True})
    document["constraints"] = pins
    return graph_from_json(document)


def solve(graph: Graph, mesh: autoshard.Mesh, budget_bytes: float | None = None) -> Any:
    hardware = autoshard.bind_hardware("dgx-h100", mesh)
    settings = autoshard.SolveSettings(time_limit_s=60, deterministic=True, memory_budget_bytes=budget_bytes)
    return autoshard.make_plan(graph, mesh, hardware, settings)


def optimizer_state(graph: Graph) -> list[str]:
    return [name for name in graph.tensors if name.startswith("adam.") and name.endswith((".m", ".v", ".master"))]


def split_over(sharding: Sharding, axis: str) -> bool:
    return any(axis in axes for axes in sharding.split_axes)


def with_state_over_dp(plan: Plan) -> Plan:
    """`plan` with the optimizer's first loop and every master weight and moment split over dp too
    (minor to what splits them already)."""
    graph, phases = plan.graph, plan.graph.phases
    options = {name: ShardingOption(((*option.loop_axes[0], "dp"), *option.loop_axes[1:]))
               if phases[name] == "optimizer" else option for name, option in plan.options.items()}
    storage = {name: Sharding(((*s.split_axes[0], "dp"), *s.split_axes[1:])) if name in optimizer_state(graph) else s
               for name, s in plan.storage.items()}
    return Plan(graph, plan.mesh, options, storage)


def test_the_solver_splits_the_adam_state_over_data_replicas_where_the_gradient_reductions_are_bandwidth_bound():
    """16.8M parameters: a reduce_scatter of the f32 gradient and an all_gather of the new bf16
    weight move less than an all_reduce of the f32 gradient, and each replica updates half the
    state; so the distributed optimizer pays in time, with no memory pressure."""
    mesh = autoshard.Mesh.parse("dp=2,tp=2")
    graph = megatron_mlp(batch=4096, hidden=1024, ffn=4096)
    result = solve(graph, mesh)
    state = optimizer_state(graph)
    assert len(state) == 12 and all(split_over(result.plan.storage[t], "dp") for t in state)
    assert plan_roles(result.plan).axes(mesh.axis_names)["dp"]["fully_sharded_data"] == ["optimizer"]
    gradients = set(graph.gradients.values())
    reductions = {s["kind"] for e in result.report.reshardings if e["tensor"] in gradients for s in e["steps"]}
    assert "reduce_scatter" in reductions and "all_reduce" not in reductions


def test_the_solver_keeps_the_adam_state_whole_where_its_collectives_are_latency_bound():
    """1M parameters: the reduce_scatter and all_gather pay two latencies where the all_reduce
    pays one, and each moves too little for the bytes to matter; the state stays whole over dp,
    and the plan with it split is slower."""
    mesh = autoshard.Mesh.parse("dp=2,tp=2")
    graph = megatron_mlp(batch=16384, hidden=256, ffn=1024)
    result = solve(graph, mesh)
    assert not any(split_over(result.plan.storage[t], "dp") for t in optimizer_state(graph))
    assert plan_roles(result.plan).axes(mesh.axis_names)["dp"] == {"data": ["dense", "other"]}
    hardware = autoshard.bind_hardware("dgx-h100", mesh)
    assert estimate(with_state_over_dp(result.plan), hardware).step_s > result.report.step_s


@pytest.fixture(scope="module")
def llama_layer() -> Graph:
    """One llama layer's bf16-mixed step, its projections pinned column- and row-parallel over tp."""
    config = GPTConfig(layers=1, hidden=1024, heads=8, seq=1024, batch=2, vocab=256, style="llama")
    with training_precision("bf16-mixed"):
        document = gpt(config, training=True)
    document["constraints"] = [c for c in layout_constraints(document, config.batch, "tp")
                               if not c["tensor"].startswith("adam.")]
    return graph_from_json(document)


def test_the_solver_splits_the_norms_on_the_sequence_over_the_tensor_axis_under_memory_pressure(llama_layer):
    """Without pressure the norms run whole on every tensor-parallel device (the fastest plan
    does not split them); at a budget below that plan's peak they run on a quarter of the
    sequence each, as Megatron's sequence parallelism does."""
    graph = llama_layer
    mesh = autoshard.Mesh.parse("dp=1,tp=4")
    norms = ["layer0.attn_norm", "layer0.mlp_norm"]
    free = solve(graph, mesh)
    assert all(free.plan.options[n].loop_axes == ((), (), ()) for n in norms)
    assert free.report.peak_memory_bytes > 105 * MiB
    pressed = solve(graph, mesh, 95 * MiB)
    assert pressed.report.peak_memory_bytes <= 95 * MiB
    assert all(pressed.plan.options[n].loop_axes == ((), ("tp",), ()) for n in norms)  # (batch, sequence, hidden)
    assert "context" in plan_roles(pressed.plan).axes(mesh.axis_names)["tp"]
