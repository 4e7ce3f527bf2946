"""Axis and tensor roles: what each tensor is (parameter, gradient, optimizer state, activation)
and what each mesh axis does per op class (data, fully-sharded data, tensor, context, expert), on
generated graphs under plans that pin the classic layouts."""

from __future__ import annotations

import json

import pytest

from autoshard.cli.main import main
from autoshard.graph.builder import GraphBuilder
from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.models.gpt import GPTConfig, gpt
from autoshard.models.mlp import MLPConfig, mlp
from autoshard.models.moe import MoEConfig, moe
from autoshard.models.training import add_training_step, weighted_sum_loss
from autoshard.planning.hardware import bind_hardware
from autoshard.planning.make_plan import SolveSettings, make_plan
from autoshard.planning.options import ShardingOption
from autoshard.planning.plan import Plan
from autoshard.planning.roles import dim_labels, op_classes, plan_roles, roles_document, tensor_roles
from autoshard.sharding import Sharding

GPT_STEP = GPTConfig(layers=1, hidden=64, heads=4, seq=16, batch=4, vocab=128)


def pinned_plan(document: dict, mesh: str, pins: dict[str, list[list[str]]]) -> Plan:
    """The deterministic solver's plan with every pin required."""
    document = dict(document, constraints=[{"tensor": t, "split_axes": axes, "required": True}
                                           for t, axes in pins.items()])
    parsed = Mesh.parse(mesh)
    graph = graph_from_json(document, parsed)
    settings = SolveSettings(time_limit_s=30, deterministic=True, workers=1)
    return make_plan(graph, parsed, bind_hardware("dgx-h100", parsed), settings).plan


def state_pins(params: list[str], axes: list[list[str]]) -> dict[str, list[list[str]]]:
    """Each parameter and its Adam moments stored as `axes`."""
    return {name: axes for p in params for name in (p, f"adam.{p}.m", f"adam.{p}.v")}


def test_tensor_roles_follow_data_flow():
    graph = graph_from_json(mlp(MLPConfig(layers=1, batch=4, hidden=8), training=True))
    roles = tensor_roles(graph)
    by_role = {role: sorted(n for n, r in roles.items() if r == role) for role in set(roles.values())}
    assert by_role["parameter"] == ["layer0.w1", "layer0.w1.new", "layer0.w2", "layer0.w2.new"]
    assert by_role["optimizer_state"] == sorted(f"adam.layer0.{w}.{m}" for w in ("w1", "w2")
                                                for m in ("m", "v", "new_m", "new_v"))
    assert by_role["gradient"] == sorted(graph.gradients.values())
    assert roles["x"] == roles["labels"] == roles["layer0.act"] == roles["adam.layer0.w1.update"] == "activation"


def test_the_parts_of_a_gradient_summed_over_uses_are_gradients():
    b = GraphBuilder("shared", "f32")
    w = b.parameter("w", (8, 8))
    y = b.op("matmul", [b.op("matmul", [b.input("x", (4, 8), batch_dim=0), w], "first"), w], "second")
    add_training_step(b, *weighted_sum_loss(b, y))
    graph = graph_from_json(b.document())
    roles = tensor_roles(graph)
    parts = [t for t in graph.producers[graph.gradients["w"]].inputs]
    assert len(parts) == 2 and all(roles[t] == "gradient" for t in parts)
    # the activation gradient flowing into the first matmul ends in w's gradient too, but is an activation
    assert roles["grad.second.0"] == "activation"


def test_batch_sequence_and_expert_dims_propagate_through_the_indexing_maps():
    labels = dim_labels(graph_from_json(gpt(GPT_STEP, training=True)))
    assert labels["ids"] == ["batch", "sequence"]
    assert labels["layer0.attn.q.heads"] == ["batch", None, "sequence", None]
    assert labels["layer0.mlp.gelu"] == labels["logits"] == ["batch", "sequence", None]
    assert labels["embed.position"] == ["sequence", None]
    assert labels["lm_head.w"] == labels["adam.lm_head.w.m"] == [None, None]
    labels = dim_labels(graph_from_json(moe(MoEConfig(layers=1, batch=2, seq=8, hidden=16, experts=4), training=True)))
    assert labels["layer0.experts.fc1.w"] == labels["adam.layer0.experts.fc1.w.new_m"] == ["expert", None, None]
    assert labels["layer0.dispatch"] == ["batch", None, "expert", None]
    assert labels["tokens"] == ["batch", None, None] and labels["layer0.router.w"] == [None, "expert"]


def test_op_classes():
    classes = op_classes(graph_from_json(gpt(GPT_STEP, training=True)))
    assert [classes[op] for op in ("embed", "layer0.attn.q", "layer0.attn.sdpa", "layer0.mlp.gelu", "grad.embed.1",
                                   "grad.layer0.mlp.fc1.1", "adam.lm_head.w.update")] == \
        ["embedding", "dense", "attention", "other", "embedding", "dense", "optimizer"]
    assert {classes[op.name] for op in graph_from_json(gpt(GPT_STEP, training=True)).ops
            if op.kind == "grad" and op.attrs["of"] == "attention"} == {"attention"}
    classes = op_classes(graph_from_json(moe(MoEConfig(layers=1, batch=2, seq=8, hidden=16, experts=4))))
    assert classes["layer0.experts.fc1"] == classes["layer0.dispatch_tokens"] == "experts"
    assert classes["layer0.residual"] == "other"


def test_explicit_tensor_parallel_and_fully_sharded_forward_plans():
    graph = graph_from_json(mlp(MLPConfig(layers=1, batch=8, hidden=16)))
    mesh = Mesh.parse("dp=2,tp=2")
    megatron = Plan(graph, mesh, {"layer0.fc1": ShardingOption((("dp",), ("tp",), ())),  # b, f, h
                                  "layer0.act": ShardingOption((("dp",), ("tp",))),
                                  "layer0.fc2": ShardingOption((("dp",), (), ("tp",)))},  # b, h, f
                    {"x": Sharding((("dp",),)), "layer0.w1": Sharding(((), ("tp",))), "layer0.w2": Sharding((("tp",),))})
    roles = plan_roles(megatron)
    assert roles.ops == {"layer0.fc1": {"dp": "data", "tp": "tensor"}, "layer0.act": {"dp": "data", "tp": "tensor"},
                         "layer0.fc2": {"dp": "data", "tp": "tensor"}}
    assert roles.axes(mesh.axis_names) == {"dp": {"data": ["dense", "other"]}, "tp": {"tensor": ["dense", "other"]}}
    fsdp = Plan(graph, mesh, {"layer0.fc1": ShardingOption((("dp", "tp"), (), ())),
                              "layer0.act": ShardingOption((("dp", "tp"), ())),
                              "layer0.fc2": ShardingOption((("dp", "tp"), (), ()))},
                {"x": Sharding((("dp", "tp"),)), "layer0.w1": Sharding((("dp",),)), "layer0.w2": Sharding((("dp",),))})
    assert plan_roles(fsdp).axes(mesh.axis_names) == {"dp": {"data": ["other"], "fully_sharded_data": ["dense"]},
                                                      "tp": {"data": ["dense", "other"]}}
    held = roles_document(fsdp)["tensors"]
    assert held["parameter"] == {"tensors": 2, "bytes": 2 * 16 * 64 * 2, "bytes_per_device": 16 * 64 * 2}  # halves over dp


def test_a_megatron_mlp_training_step():
    pins = {"x": [["dp"]], "labels": [["dp"]]}
    for layer in range(2):
        pins |= state_pins([f"layer{layer}.w1"], [[], ["tp"]]) | state_pins([f"layer{layer}.w2"], [["tp"], []])
        # the forward fixed whole, so the roles read do not hang on the solver's choice among near ties
        pins |= {f"layer{layer}.fc1": [["dp"], ["tp"]], f"layer{layer}.act": [["dp"], ["tp"]],
                 f"layer{layer}.fc2": [["dp"], []]}
    plan = pinned_plan(mlp(MLPConfig(layers=2, batch=8, hidden=64), training=True), "dp=2,tp=2", pins)
    roles = plan_roles(plan)
    assert roles.axes(plan.mesh.axis_names) == {"dp": {"data": ["dense", "other"]},
                                                "tp": {"tensor": ["dense", "other", "optimizer"]}}
    assert roles.ops["layer0.fc2"] == {"dp": "data", "tp": "tensor"}
    held = roles_document(plan)["tensors"]
    assert held["parameter"]["bytes_per_device"] == held["parameter"]["bytes"] // 2
    assert held["optimizer_state"]["bytes_per_device"] == held["optimizer_state"]["bytes"] // 2


def test_a_fully_sharded_mlp_training_step():
    pins = {"x": [["dp"]], "labels": [["dp"]]}
    for layer in range(2):
        pins |= state_pins([f"layer{layer}.w1", f"layer{layer}.w2"], [["dp"]])
        pins |= {f"layer{layer}.{value}": [["dp"]] for value in ("fc1", "act", "fc2")}
    plan = pinned_plan(mlp(MLPConfig(layers=2, batch=8, hidden=64), training=True), "dp=4", pins)
    roles = plan_roles(plan)
    # the weights and their gradients' ops are fully sharded; the activation and loss are plain data
    assert roles.axes(plan.mesh.axis_names) == {"dp": {"data": ["other"], "fully_sharded_data": ["dense", "optimizer"]}}
    assert roles.ops["layer0.fc1"] == roles.ops["grad.layer0.fc1.1"] == {"dp": "fully_sharded_data"}
    held = roles_document(plan)["tensors"]
    assert held["parameter"]["bytes_per_device"] == held["parameter"]["bytes"] // 4
    assert held["optimizer_state"]["bytes_per_device"] == held["optimizer_state"]["bytes"] // 4


def test_megatron_attention_and_context_parallel_gpt_steps():
    pins = {"ids": [["dp"]], "labels": [["dp"]], "layer0.attn.sdpa": [["dp"], ["tp"]],
            "layer0.mlp.gelu": [["dp"], [], ["tp"]]}
    # Megatron's column-parallel projections, so the roles read do not hang on near ties
    pins |= {f"layer0.{linear}": [["dp"], [], ["tp"]] for linear in ("attn.q", "attn.k", "attn.v", "mlp.fc1")}
    pins |= state_pins([f"layer0.{linear}.w" for linear in ("attn.q", "attn.k", "attn.v", "mlp.fc1")], [[], ["tp"]])
    plan = pinned_plan(gpt(GPT_STEP, training=True), "dp=2,tp=2", pins)
    roles = plan_roles(plan)
    assert roles.ops["layer0.attn.sdpa"] == {"dp": "data", "tp": "tensor"}
    assert roles.axes(plan.mesh.axis_names) == {"dp": {"data": ["attention", "dense", "other"]},
                                                "tp": {"tensor": ["attention", "dense", "other", "optimizer"]}}
    pins = {"ids": [["dp"], ["sp"]], "labels": [["dp"], ["sp"]], "layer0.attn.sdpa": [["dp"], [], ["sp"]],
            "layer0.mlp.gelu": [["dp"], ["sp"]]}
    pins |= {f"layer0.{linear}": [["dp"], ["sp"]] for linear in ("attn.q", "attn.k", "attn.v", "mlp.fc1", "mlp.fc2")}
    pins["embed"] = [["dp"], ["sp"]]
    plan = pinned_plan(gpt(GPT_STEP, training=True), "dp=2,sp=2", pins)
    roles = plan_roles(plan)
    assert roles.ops["layer0.attn.sdpa"] == {"dp": "data", "sp": "context"}
    every = ["embedding", "attention", "dense", "other"]
    axes = roles.axes(plan.mesh.axis_names)
    # (how the optimizer's state lies is the solver's free choice here)
    assert axes["dp"]["data"] == every and axes["sp"]["context"] == every


def test_an_expert_parallel_moe_step():
    pins = {"x": [["dp"]], "labels": [["dp"]], "layer0.dispatch": [["dp"]], "layer0.experts.act": [["ep"]],
            "layer0.router": [["dp"]], "layer0.combine": [["dp"]]}
    pins |= state_pins(["layer0.experts.fc1.w", "layer0.experts.fc2.w"], [["ep"]])
    config = MoEConfig(layers=1, batch=4, seq=8, hidden=32, experts=4)
    plan = pinned_plan(moe(config, training=True), "dp=2,ep=2", pins)
    roles = plan_roles(plan)
    assert roles.ops["layer0.experts.fc1"] == {"ep": "expert"}
    assert roles.axes(plan.mesh.axis_names) == {"dp": {"data": ["experts", "other"]},
                                                "ep": {"expert": ["experts", "optimizer"]}}



def test_experts_split_only_by_the_optimizer_are_its_data_replicas():
    """Experts computed on every device over a batch axis, their Adam state split over that axis on
    the expert dim (ZeRO over data replicas): the axis is data for the experts and fully-sharded data
    for the optimizer, not an expert axis."""
    pins = {"x": [["dp"]], "labels": [["dp"]], "layer0.dispatch": [["dp"]], "layer0.experts.act": [[], ["dp"]],
            "layer0.router": [["dp"]], "layer0.combine": [["dp"]]}
    weights = ["layer0.experts.fc1.w", "layer0.experts.fc2.w"]
    pins |= {w: [[], [], []] for w in weights} | {f"adam.{w}.{m}": [["dp"]] for w in weights for m in "mv"}
    plan = pinned_plan(moe(MoEConfig(layers=1, batch=4, seq=8, hidden=32, experts=4), training=True), "dp=2", pins)
    roles = plan_roles(plan)
    assert roles.ops["layer0.experts.fc1"] == {"dp": "data"}
    assert plan.storage["adam.layer0.experts.fc1.w.m"].used_axes() == ("dp",)
    update = next(op.name for op in plan.graph.ops if "adam.layer0.experts.fc1.w.new_m" in op.outputs)
    assert roles.ops[update] == {"dp": "fully_sharded_data"}
    axes = roles.axes(plan.mesh.axis_names)
    assert "expert" not in axes["dp"] and "optimizer" in axes["dp"]["fully_sharded_data"]

def test_plan_and_estimate_say_the_roles(tmp_path, capsys):
    graph = tmp_path / "mlp.json"
    graph.write_text(json.dumps(mlp(MLPConfig(layers=1, batch=8, hidden=32), training=True)))
    out = tmp_path / "out"
    assert main(["plan", str(graph), "--mesh", "dp=2", "--topology", "dgx-h100", "--deterministic",
                 "--verify", "never", "-o", str(out)]) == 0
    document = json.loads((out / "plan.json").read_text())
    assert set(document["roles"]) == {"axes", "tensors", "tensor_roles", "batch_declared"}
    assert document["roles"]["tensor_roles"]["layer0.w1"] == "parameter"
    assert document["ops"]["layer0.fc1"]["class"] == "dense"
    printed = capsys.readouterr().out
    assert "axis roles: dp = " in printed and "per device: parameters " in printed and "optimizer state" in printed
    assert main(["estimate", str(graph), "--mesh", "dp=2", "--topology", "dgx-h100",
                 "--plan", str(out / "plan.json")]) == 0
    assert "axis roles: dp = " in capsys.readouterr().out
    assert main(["estimate", str(graph), "--mesh", "dp=2", "--topology", "dgx-h100",
                 "--plan", str(out / "plan.json"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["roles"] == document["roles"]


@pytest.mark.parametrize("declared", [True, False])
def test_without_a_declared_batch_dim_no_axis_reads_as_data(declared):
    document = mlp(MLPConfig(layers=1, batch=8, hidden=16))
    if not declared:
        del document["tensors"]["x"]["batch_dim"]
    graph = graph_from_json(document)
    mesh = Mesh.parse("dp=2")
    options = {op.name: ShardingOption((("dp",),) + ((),) * (op.nest.num_loops - 1)) for op in graph.ops}
    plan = Plan(graph, mesh, options, {"x": Sharding((("dp",),)), "layer0.w1": Sharding(), "layer0.w2": Sharding()})
    roles = plan_roles(plan)
    assert roles.batch_declared is declared
    assert roles.axes(mesh.axis_names) == {"dp": {"data" if declared else "tensor": ["dense", "other"]}}
