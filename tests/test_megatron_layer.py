"""The Megatron-LM GPT layer (`generate gpt --style megatron`): what its training step keeps from
forward to backward, read from the plan's live ranges and shardings, equals Korthikanti et al.'s
activation formulas term by term, unsharded and under Megatron's tensor parallelism; and its
plans compute what the graph computes."""

from __future__ import annotations

import pytest

from autoshard.graph.model import Graph, live_ranges
from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.models import GPTConfig, gpt
from autoshard.planning.costs import tensor_bytes
from autoshard.planning.hardware import bind_hardware
from autoshard.planning.make_plan import SolveSettings, make_plan
from autoshard.planning.options import ShardingOption
from autoshard.planning.plan import Plan
from autoshard.sharding import Sharding
from autoshard.sim.program import verify_plan

CONFIG = GPTConfig(layers=2, hidden=64, heads=4, seq=32, batch=2, vocab=128, style="megatron")
S, B, H, A = CONFIG.seq, CONFIG.batch, CONFIG.hidden, CONFIG.heads

# Megatron's tensor parallelism: heads and the MLP's features split over tp, the rest whole
HEAD_SPLIT = ("attn.q.heads", "attn.k.heads", "attn.v.heads", "attn.softmax", "attn.attn_dropout.kept",
              "attn.attn_dropout", "attn.attn_dropout.mask")
FEATURE_SPLIT = ("attn.merged", "mlp.fc1", "mlp.gelu")
WHOLE = ("attn_norm", "mlp_norm", "attn_residual", "mlp_residual", "attn.out_dropout.mask", "mlp.dropout.mask")
COLUMN, ROW = ("attn.q.w", "attn.k.w", "attn.v.w", "mlp.fc1.w"), ("attn.out.w", "mlp.fc2.w")


def kept_bytes(plan: Plan, layer: int) -> int:
    """Bytes per device of the values layer `layer`'s backward reads that were there before the
    backward began (activations and masks, not parameters, gradients or scalars), each held from
    its forward step past the first backward op, as the live ranges say."""
    graph = plan.graph
    order = list(graph.order)
    ranges = live_ranges(graph, order)
    phases = graph.phases
    backward = [i for i, op in enumerate(order) if phases[op.name] == "backward"]
    kept: set[str] = set()
    for op in order:
        if phases[op.name] != "backward" or op.layer != layer:
            continue
        for name in op.inputs:
            tensor, producer = graph.tensors[name], graph.producers.get(name)
            if tensor.role == "parameter" or not tensor.shape or (producer and phases[producer.name] != "forward"):
                continue
            assert ranges[name][0] < backward[0] <= ranges[name][1], name  # held across the turn
            kept.add(name)
    return sum(tensor_bytes(graph.tensors[t].shape, graph.tensors[t].itemsize, plan.produced(t), plan.mesh)
               for t in kept)


def korthikanti(tensor: int = 1, sequence_parallel: bool = False) -> float:
    """Activation bytes of a layer per device: sbh(10 + 24/t + 5as/(ht)) (at t = 1, sbh(34 + 5as/h));
    with sequence parallelism sbh(34 + 5as/h)/t."""
    if sequence_parallel:
        return S * B * H * (34 + 5 * A * S / H) / tensor
    return S * B * H * (10 + 24 / tensor + 5 * A * S / (H * tensor))


def megatron_constraints(graph: Graph, sequence_parallel: bool) -> list[dict]:
    """Megatron's layout pinned: heads and MLP features over tp; norms, residuals and the masks
    beside them whole, or split on the sequence with sequence parallelism."""
    constraints = []
    for name, tensor in graph.tensors.items():
        local = name.split(".", 1)[-1]
        rank = len(tensor.shape)
        if local.endswith(HEAD_SPLIT):
            axes = [[], ["tp"]] + [[]] * (rank - 2)
        elif local.endswith(FEATURE_SPLIT):
            axes = [[]] * (rank - 1) + [["tp"]]
        elif local.endswith(COLUMN):
            axes = [[], ["tp"]]
        elif local.endswith(ROW):
            axes = [["tp"], []]
        elif (local.endswith(WHOLE) and name.startswith("layer")) or name == "embed.position_add":  # layer 0's input
            axes = [[], ["tp"], []] if sequence_parallel else [[]] * rank
        else:
            continue
        constraints.append({"tensor": name, "split_axes": axes, "required": True})
    return constraints


@pytest.fixture(scope="module")
def document() -> dict:
    return gpt(CONFIG, training=True)


def test_the_unsharded_layer_keeps_sbh_34_plus_5as_over_h(document):
    mesh = Mesh.of(tp=1)
    graph = graph_from_json(document, mesh)
    replicated = Plan(graph, mesh, {op.name: ShardingOption.replicated(op.nest.num_loops) for op in graph.ops},
                      {t.name: Sharding() for t in graph.tensors.values() if t.role != "intermediate"})
    for layer in range(CONFIG.layers):
        assert kept_bytes(replicated, layer) == korthikanti() == S * B * H * (34 + 5 * A * S / H)


@pytest.mark.parametrize("sequence_parallel", [False, True], ids=["tensor", "tensor+sequence"])
def test_under_megatrons_tensor_parallelism_the_layer_keeps_what_the_paper_counts(document, sequence_parallel):
    """sbh(10 + 24/t + 5as/(ht)), and sbh(34 + 5as/h)/t with sequence parallelism, at t = 4."""
    mesh = Mesh.of(tp=4)
    pinned = dict(document, constraints=megatron_constraints(graph_from_json(document), sequence_parallel))
    graph = graph_from_json(pinned, mesh)
    result = make_plan(graph, mesh, bind_hardware("dgx-a100", mesh),
                       SolveSettings(time_limit_s=20, workers=1, deterministic=True))
    for layer in range(CONFIG.layers):
        assert kept_bytes(result.plan, layer) == korthikanti(4, sequence_parallel)
    assert verify_plan(result.plan).passed


def test_the_layer_is_megatrons_and_other_shapes_are_refused():
    graph = graph_from_json(gpt(CONFIG))
    kinds = {op.name: op.kind for op in graph.ops}
    # unfused attention: scores, softmax and dropout are ops of their own; biases and layer norms
    assert [kinds[f"layer0.attn.{n}"] for n in ("scores", "masked", "softmax", "attn_dropout.kept", "context")] == \
        ["batch_matmul", "add", "softmax", "select", "batch_matmul"]
    assert "attention" not in kinds.values()
    assert kinds["layer0.mlp.fc1"] == "add" and kinds["layer0.attn_norm"] == "layer_norm"
    assert graph.tensors["layer0.attn.attn_dropout.mask"].dtype == "bool"
    with pytest.raises(Exception, match="kv_heads"):
        GPTConfig(style="megatron", heads=12, kv_heads=4)
    with pytest.raises(Exception, match="moe_experts"):
        GPTConfig(style="megatron", moe_experts=8)
