"""Generated grouped-query attention and routed experts: K and V live at kv heads, query heads
read their group's K/V head, MoE dispatch grows linearly with the tokens, and plans of both
simulate to the unsharded values, an expert split after a token split being an all-to-all."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from autoshard.cli.main import main
from autoshard.errors import InputError
from autoshard.graph.evaluate import evaluate_graph, random_inputs
from autoshard.graph.schema import graph_from_json, load_graph
from autoshard.mesh import Mesh
from autoshard.models import GPTConfig, MoEConfig, gpt, moe
from autoshard.planning.hardware import bind_hardware
from autoshard.planning.make_plan import SolveSettings, make_plan
from autoshard.planning.roles import plan_roles
from autoshard.sim.program import verify_plan

GQA = GPTConfig(layers=1, hidden=32, heads=8, kv_heads=2, seq=8, batch=4, vocab=64, dtype="f32", style="llama")
MOE_GPT = GPTConfig(layers=1, hidden=16, heads=2, seq=8, batch=4, vocab=32, dtype="f32", moe_experts=8, moe_top_k=2,
                    moe_ffn=8, moe_shared_experts=1)


def plan_of(document: dict, mesh_text: str, pins: dict[str, list[list[str]]] | None = None):
    document = dict(document, constraints=[{"tensor": t, "split_axes": axes, "required": True}
                                           for t, axes in (pins or {}).items()])
    mesh = Mesh.parse(mesh_text)
    hardware = bind_hardware("dgx-h100", mesh)
    result = make_plan(graph_from_json(document, mesh), mesh, hardware,
                       SolveSettings(time_limit_s=30, deterministic=True, workers=1))
    return result, hardware


@pytest.mark.parametrize("kv_heads", [2, 1], ids=["grouped", "multi-query"])
def test_k_and_v_are_projected_and_held_at_kv_heads(kv_heads):
    graph = graph_from_json(gpt(replace(GQA, kv_heads=kv_heads)))
    t = graph.tensors
    head_dim = 32 // 8
    for n in "kv":
        assert t[f"layer0.attn.{n}.w"].shape == (32, kv_heads * head_dim)
        assert t[f"layer0.attn.{n}.heads"].shape == (4, kv_heads, 8, head_dim)
        heads = t[f"layer0.attn.{n}.heads"]
        assert math.prod(heads.shape) * heads.itemsize == 4 * kv_heads * 8 * head_dim * 4
        # the repeat to the query heads is a view of the kv heads: no memory of its own
        repeat = graph.producers[f"layer0.attn.{n}.grouped"]
        assert t[repeat.outputs[0]].shape == (4, 8, 8, head_dim)
        assert repeat.op_kind.view and graph.producers[repeat.inputs[0]].op_kind.view
    assert t["layer0.attn.q.heads"].shape == (4, 8, 8, head_dim)


def test_each_query_head_reads_the_kv_head_of_its_group():
    graph = graph_from_json(gpt(GQA))
    values = evaluate_graph(graph, random_inputs(graph, seed=3))
    q, k, v = (values[f"layer0.attn.{n}.heads"] for n in "qkv")
    group = 8 // 2
    scores = np.einsum("bhsd,bhtd->bhst", q, np.repeat(k, group, axis=1)) / math.sqrt(q.shape[-1])
    scores = np.where(np.tril(np.ones((8, 8), dtype=bool)), scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    expected = np.einsum("bhst,bhte->bhse", weights, np.repeat(v, group, axis=1))
    np.testing.assert_allclose(values["layer0.attn.sdpa"], expected, rtol=1e-5, atol=1e-6)


def test_a_gqa_training_step_with_kv_heads_split_simulates_to_the_unsharded_values():
    # the K/V heads split over tp: each device's query heads are the groups of its K/V heads
    pins = {"ids": [["dp"], []], "layer0.attn.sdpa": [["dp"], ["tp"], [], []],
            "layer0.attn.k.heads": [["dp"], ["tp"], [], []], "layer0.attn.v.heads": [["dp"], ["tp"], [], []]}
    result, hardware = plan_of(gpt(GQA, training=True), "dp=2,tp=2", pins)
    assert result.plan.options["layer0.attn.sdpa"].loop_axes[1] == ("tp",)
    verdict = verify_plan(result.plan, hardware.collective_seconds)
    assert verdict.passed and verdict.values_checked, verdict.summary()


def test_moe_dispatch_and_combine_flops_double_with_the_tokens():
    def flops(config) -> dict[str, float]:
        graph = graph_from_json(moe(config))
        names = ("dispatch_tokens", "combine", "experts.fc1")
        return {name: graph.op_by_name[f"layer0.{name}"].flops() for name in names}
    base = MoEConfig(batch=2, seq=64, hidden=16, ffn=32, experts=4, top_k=2, dtype="f32")
    single, double = flops(base), flops(replace(base, batch=4))
    assert all(double[name] == 2 * single[name] for name in single)
    # 2 T top_k capacity_factor S H: per token, the group size's worth, however many tokens
    assert single["dispatch_tokens"] == 2 * (2 * 64) * 4 * base.capacity * 16 == single["combine"]


def test_a_gpt_layer_with_fine_grained_and_shared_experts():
    graph = graph_from_json(gpt(MOE_GPT))
    t = graph.tensors
    assert t["layer0.mlp.experts.fc1.w"].shape == (8, 16, 8) and t["layer0.mlp.experts.fc2.w"].shape == (8, 8, 16)
    assert t["layer0.mlp.shared.fc1.w"].shape == (16, 8)  # one shared expert of moe_ffn features
    assert t["layer0.mlp.dispatch"].shape == (4, 8, 8, math.ceil(2 * 8 * 1.25 / 8))  # a group per sequence
    assert t["layer0.mlp.router.w"].shape == (16, 8)
    values = evaluate_graph(graph, random_inputs(graph, seed=1))
    assert np.isfinite(values["logits"]).all()


def test_splitting_the_experts_after_the_groups_is_an_all_to_all_and_simulates():
    # tokens (their groups) over ep up to the dispatch, the experts over ep after it
    config = MoEConfig(layers=1, batch=4, seq=64, hidden=4096, ffn=32, experts=4, top_k=2, dtype="f32")
    pins = {"x": [["ep"], [], []], "layer0.dispatch": [["ep"], [], [], []],
            "layer0.dispatch_tokens": [["ep"], [], [], []], "layer0.combine": [["ep"], [], []]}
    pins |= {f"layer0.experts.{n}": [["ep"], [], [], []] for n in ("fc1", "act", "fc2")}
    pins |= {f"layer0.experts.{n}.w": [["ep"], [], []] for n in ("fc1", "fc2")}
    result, hardware = plan_of(moe(config), "ep=4", pins)  # on 2 devices the swap is priced as one send each way
    reshardings = result.report.to_json()["reshardings"]
    kinds = {(r["tensor"], r["consumer"]): [s["kind"] for s in r["steps"]] for r in reshardings}
    assert kinds == {("layer0.dispatch_tokens", "layer0.experts.fc1"): ["all_to_all"],  # tokens to their experts
                     ("layer0.experts.fc2", "layer0.combine"): ["all_to_all"]}  # and back
    verdict = verify_plan(result.plan, hardware.collective_seconds)
    assert verdict.passed and verdict.values_checked, verdict.summary()


@pytest.mark.parametrize("make, field", [
    (lambda: GPTConfig(heads=12, kv_heads=5), "kv_heads"),
    (lambda: GPTConfig(kv_heads=0), "kv_heads"),
    (lambda: GPTConfig(moe_experts=-1), "moe_experts"),
    (lambda: GPTConfig(moe_experts=4, moe_top_k=5), "moe_top_k"),
    (lambda: GPTConfig(moe_experts=4, moe_ffn=0), "moe_ffn"),
    (lambda: GPTConfig(moe_experts=4, moe_shared_experts=-2), "moe_shared_experts"),
    (lambda: GPTConfig(moe_experts=4, moe_capacity_factor=float("inf")), "moe_capacity_factor"),
    (lambda: GPTConfig(moe_experts=4, moe_group_size=1000), "moe_group_size"),
    (lambda: MoEConfig(group_size=3), "group_size"),
])
def test_bad_fields_are_named(make, field):
    with pytest.raises(InputError) as error:
        make()
    assert [p.where for p in error.value.problems] == [field]


def test_generate_takes_the_new_flags_and_names_a_bad_one(tmp_path, capsys):
    path = tmp_path / "graph.json"
    argv = ["generate", "gpt", "--layers", "1", "--hidden", "16", "--heads", "4", "--kv-heads", "2", "--seq", "8",
            "--batch", "2", "--vocab", "32", "--style", "llama", "--moe-experts", "4", "--moe-top-k", "1",
            "--moe-ffn", "8", "--moe-shared-experts", "1", "--moe-capacity-factor", "2", "--moe-group-size", "4",
            "--training", "-o", str(path)]
    assert main(argv) == 0
    tensors = load_graph(path).tensors
    assert tensors["layer0.attn.k.heads"].shape == (2, 2, 8, 4)
    assert tensors["layer0.mlp.dispatch"].shape == (4, 4, 4, 2)  # 4 groups of 4 tokens, 2 * 4 * 1 / 4 slots
    assert tensors["labels"].shape == (2, 8)
    capsys.readouterr()
    assert main(["generate", "gpt", "--heads", "12", "--kv-heads", "5", "-o", str(path)]) == 2
    assert "--kv-heads: must divide heads (12), got 5" in capsys.readouterr().err
    assert main(["generate", "moe", "--group-size", "3", "-o", str(path)]) == 2
    assert "--group-size: must divide the tokens" in capsys.readouterr().err


def test_a_gpt_training_step_with_experts_split_over_ep_simulates_and_ep_reads_as_expert_parallel():
    pins = {"ids": [["dp"], []], "layer0.mlp.experts.fc1.w": [["ep"], [], []]}
    result, hardware = plan_of(gpt(replace(MOE_GPT, kv_heads=1), training=True), "dp=2,ep=2", pins)
    assert plan_roles(result.plan).axes(result.plan.mesh.axis_names)["ep"] == {"expert": ["experts", "optimizer"]}
    verdict = verify_plan(result.plan, hardware.collective_seconds)
    assert verdict.passed and verdict.values_checked, verdict.summary()
