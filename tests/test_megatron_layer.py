"""The Megatron-LM GPT layer (`generate gpt --style megatron`): what its training step keeps from
forward to backward, read from the plan's live ranges and shardings, equals Korthikanti et al.'s
activation formulas term by term, unsharded and under Megatron's tensor parallelism; and its
plans compute what the graph computes."""

from __future__ import annotations

import pytest

from autoshard.errors import InputError
from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.models import GPTConfig, gpt
from autoshard.models.layouts import megatron_constraints
from autoshard.planning.hardware import bind_hardware
from autoshard.planning.kept import kept_activation_bytes
from autoshard.planning.make_plan import SolveSettings, make_plan
from autoshard.planning.options import ShardingOption
from autoshard.planning.plan import Plan
from autoshard.sharding import Sharding
from autoshard.sim.program import verify_plan

CONFIG = GPTConfig(layers=2, hidden=64, heads=4, seq=32, batch=2, vocab=128, style="megatron")
S, B, H, A = CONFIG.seq, CONFIG.batch, CONFIG.hidden, CONFIG.heads

def korthikanti(tensor: int = 1, sequence_parallel: bool = False) -> float:
    """Activation bytes of a layer per device: sbh(10 + 24/t + 5as/(ht)) (at t = 1, sbh(34 + 5as/h));
    with sequence parallelism sbh(34 + 5as/h)/t."""
    if sequence_parallel:
        return S * B * H * (34 + 5 * A * S / H) / tensor
    return S * B * H * (10 + 24 / tensor + 5 * A * S / (H * tensor))


@pytest.fixture(scope="module")
def document() -> dict:
    return gpt(CONFIG, training=True)


def test_the_unsharded_layer_keeps_sbh_34_plus_5as_over_h(document):
    mesh = Mesh.of(tp=1)
    graph = graph_from_json(document, mesh)
    replicated = Plan(graph, mesh, {op.name: ShardingOption.replicated(op.nest.num_loops) for op in graph.ops},
                      {t.name: Sharding() for t in graph.tensors.values() if t.role != "intermediate"})
    for layer in range(CONFIG.layers):
        assert kept_activation_bytes(replicated, layer) == korthikanti() == S * B * H * (34 + 5 * A * S / H)


@pytest.mark.parametrize("sequence_parallel", [False, True], ids=["tensor", "tensor+sequence"])
def test_under_megatrons_tensor_parallelism_the_layer_keeps_what_the_paper_counts(document, sequence_parallel):
    """sbh(10 + 24/t + 5as/(ht)), and sbh(34 + 5as/h)/t with sequence parallelism, at t = 4."""
    mesh = Mesh.of(tp=4)
    pinned = dict(document, constraints=megatron_constraints(document, sequence_parallel))
    graph = graph_from_json(pinned, mesh)
    result = make_plan(graph, mesh, bind_hardware("dgx-a100", mesh),
                       SolveSettings(time_limit_s=20, workers=1, deterministic=True))
    for layer in range(CONFIG.layers):
        assert kept_activation_bytes(result.plan, layer) == korthikanti(4, sequence_parallel)
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
    with pytest.raises(InputError, match="kv_heads"):
        GPTConfig(style="megatron", heads=12, kv_heads=4)
    with pytest.raises(InputError, match="moe_experts"):
        GPTConfig(style="megatron", moe_experts=8)
