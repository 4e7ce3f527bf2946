"""`autoshard plan --pipeline S`: a GPT training step cut into stages on sub-meshes, priced by
simulating the schedule; the cut moved by an expensive embedding or head; errors naming the flag."""

from __future__ import annotations

import json

import pytest

from autoshard.cli.main import main
from autoshard.errors import InfeasibleError, InputError
from autoshard.graph.builder import GraphBuilder
from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.models.gpt import GPTConfig, gpt
from autoshard.models.training import add_training_step, weighted_sum_loss
from autoshard.pipeline import simulate_pipeline, stage_orders
from autoshard.planning.hardware import bind_hardware
from autoshard.planning.make_plan import SolveSettings
from autoshard.planning import pipeline_plan
from autoshard.planning.pipeline_plan import PipelineSettings, pipeline_mesh, plan_pipeline
from autoshard.planning.pipeline_stages import balanced_cuts, op_positions
from autoshard.planning.pipeline_work import work_kinds
from support.cli import mlp_graph

GPT = GPTConfig(layers=4, hidden=64, heads=4, seq=16, batch=8, vocab=256)
MICROBATCHES = 4


def gpt_file(folder, config: GPTConfig = GPT) -> str:
    path = folder / "gpt.json"
    path.write_text(json.dumps(gpt(config, training=True)))
    return str(path)


def pipeline_args(graph: str, *extra: str) -> list[str]:
    return ["plan", graph, "--mesh", "dp=2", "--deterministic", "--verify", "never", *extra]


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """The 4-layer GPT step on 2 stages of dp=2 (4 devices), 1F1B over 4 microbatches."""
    folder = tmp_path_factory.mktemp("pipeline")
    trace = folder / "out" / "trace.json"
    assert main(pipeline_args(gpt_file(folder), "--pipeline", "2", "--microbatches", str(MICROBATCHES),
                              "-o", str(folder / "out"), "--trace", str(trace))) == 0
    document = json.loads((folder / "out" / "plan.json").read_text())
    return document, json.loads(trace.read_text())


def test_stages_are_contiguous_layer_ranges_on_their_own_devices(planned):
    document, _ = planned
    section = document["pipeline"]
    assert (section["stage_count"], section["microbatches"], section["virtual_stages_per_stage"],
            section["schedule"]) == (2, MICROBATCHES, 1, "1f1b")
    stages = section["stages"]
    assert [[chunk["layers"] for chunk in stage["chunks"]] for stage in stages] == [[[0, 1]], [[2, 3]]]
    assert [stage["devices"] for stage in stages] == [[0, 1], [2, 3]]
    assert all(stage["mesh"] == {"axes": [{"name": "dp", "size": 2}]} for stage in stages)
    first, last = (set(stage["chunks"][0]["ops"]) for stage in stages)
    # the embedding, its gradient and its update with the first stage; the head and loss with the last
    assert {"embed", "grad.embed.1", "embed.table.new", "layer1.mlp.fc2", "grad.layer0.attn.q.1"} <= first
    assert {"logits", "loss", "grad.logits", "lm_head.w.new", "layer2.attn_norm"} <= last
    assert not first & last and first | last == set(document["ops"])  # plan.json's ops are the union


def test_the_step_is_the_simulation_of_the_recorded_seconds(planned):
    document, _ = planned
    section = document["pipeline"]
    stages = section["stages"]
    timeline = simulate_pipeline(stage_orders("1f1b", 2, MICROBATCHES),
                                 [s["forward_s"] for s in stages], [s["backward_s"] for s in stages],
                                 [s["weight_s"] for s in stages],
                                 transfer_s=[section["transfer_s"]["forward"], section["transfer_s"]["backward"]],
                                 tail_s={name: [s["tail_s"][name] for s in stages] for name in stages[0]["tail_s"]})
    assert section["step_s"] == pytest.approx(timeline.step_s, rel=1e-12)
    assert section["bubble_fraction"] == pytest.approx(timeline.bubble_fraction, rel=1e-12)
    assert all(s["forward_s"] > 0 and s["backward_s"] > 0 and s["weight_s"] > 0 for s in stages)
    assert all(seconds > 0 for direction in ("forward", "backward") for seconds in section["transfer_s"][direction])


def test_the_1f1b_bubble_is_each_stages_idle_time_over_its_busy_time(planned):
    section = planned[0]["pipeline"]
    stages = section["stages"]
    for stage in stages:  # busy: M microbatches' F, B and W; idle: the rest of the span before the tails
        assert stage["busy_s"] == pytest.approx(MICROBATCHES * (stage["forward_s"] + stage["backward_s"]
                                                                + stage["weight_s"]), rel=1e-9)
    span = stages[0]["busy_s"] + stages[0]["idle_s"]
    assert all(s["busy_s"] + s["idle_s"] == pytest.approx(span, rel=1e-12) for s in stages)
    assert section["bubble_fraction"] == pytest.approx(sum(s["idle_s"] for s in stages)
                                                       / sum(s["busy_s"] for s in stages), rel=1e-12)
    tails = max(sum(s["tail_s"].values()) for s in stages)
    assert span <= section["step_s"] <= span + tails + 1e-15


def test_each_stages_memory_is_its_state_plus_the_microbatches_in_flight(planned):
    document, _ = planned
    stages = document["pipeline"]["stages"]
    for index, stage in enumerate(stages):
        memory, chunk = stage["memory"], stage["chunks"][0]
        assert memory["inflight_chunks"] == min(2 - index, MICROBATCHES)  # 1F1B: stage i holds S - i
        assert memory["activation_bytes"] == memory["inflight_chunks"] * chunk["saved_activation_bytes_per_microbatch"]
        assert memory["gradient_bytes"] == 2 * memory["parameter_bytes"]  # bf16 gradients accumulate in f32
        assert memory["optimizer_state_bytes"] == 4 * memory["parameter_bytes"]  # Adam's two f32 moments
        parts = ("parameter_bytes", "gradient_bytes", "optimizer_state_bytes", "activation_bytes")
        assert memory["peak_bytes"] == sum(memory[part] for part in parts)
    held = document["roles"]["tensors"]
    assert sum(s["memory"]["parameter_bytes"] for s in stages) == held["parameter"]["bytes_per_device"]
    assert sum(s["memory"]["optimizer_state_bytes"] for s in stages) == held["optimizer_state"]["bytes_per_device"]


def test_the_traces_last_slice_ends_at_the_predicted_step(planned):
    document, trace = planned
    slices = [event for event in trace["traceEvents"] if event["ph"] == "X"]
    assert max(e["ts"] + e["dur"] for e in slices) == pytest.approx(document["pipeline"]["step_s"] * 1e6, rel=1e-9)
    assert sum(e["name"].startswith(("activation", "gradient")) for e in slices) == 2 * MICROBATCHES


def test_interleaved_stages_run_every_other_part_and_the_step_is_their_simulation():
    mesh = Mesh.of(dp=2)
    hw = bind_hardware("dgx-h100", pipeline_mesh(mesh, 2))
    pipelined = plan_pipeline(graph_from_json(gpt(GPT, training=True)), mesh, hw,
                              SolveSettings(deterministic=True, microbatches=MICROBATCHES),
                              PipelineSettings(2, "interleaved", 2))
    parts = pipelined.parts
    assert [(p.layers, p.stage, p.chunk) for p in parts] == [((0, 0), 0, 0), ((1, 1), 1, 0), ((2, 2), 0, 1),
                                                              ((3, 3), 1, 1)]
    table = [[[[p.forward_s, p.backward_s, p.weight_s][kind] for p in parts if p.stage == stage]
              for stage in range(2)] for kind in range(3)]
    timeline = simulate_pipeline(stage_orders("interleaved", 2, MICROBATCHES, 2), *table,
                                 transfer_s=[pipelined.transfer_s["forward"], pipelined.transfer_s["backward"]],
                                 tail_s=pipelined.tail_s)
    assert pipelined.timeline.step_s == timeline.step_s
    assert len(timeline.transfers) == 2 * MICROBATCHES * (2 * 2 - 1)
    section = pipelined.to_json()
    assert [[c["virtual_stage"] for c in stage["chunks"]] for stage in section["stages"]] == [[0, 2], [1, 3]]


def test_backward_ops_are_input_or_weight_gradients_by_data_flow():
    graph = graph_from_json(gpt(GPT, training=True))
    kinds = work_kinds(graph, op_positions(graph))
    assert kinds["layer2.mlp.fc1"] == "F" and kinds["adam.layer2.mlp.fc1.w.update"] == "tail"
    # a matmul's gradient for its input reaches the layer below; its weight's gradient only the optimizer
    assert kinds["grad.layer2.mlp.fc1.0"] == "B" and kinds["grad.layer2.mlp.fc1.1"] == "W"
    assert kinds["grad.layer2.mlp.fc1.bias.1.sum"] == "W" and kinds["grad.logits.0"] == "B"
    # the first layer's input gradient reaches only the embedding's gradient: nothing waits for it
    assert kinds["grad.layer0.mlp.fc1.0"] == "W" and kinds["grad.embed.1"] == "W"


def stack(expensive: str) -> dict:
    """Four layers of one matmul each between an input projection and a head; the one named
    `expensive` ("embed", "head" or neither) is 16 times a layer's work."""
    width, wide = 128, 2048
    b = GraphBuilder(f"stack_{expensive}", "f32")
    x = b.input("x", (32, wide if expensive == "embed" else width), batch_dim=0)
    x = b.op("matmul", [x, b.parameter("embed.w", (b.shape(x)[1], width))], "embed")
    for layer in range(4):
        b.layer = layer
        x = b.op("relu", [b.op("matmul", [x, b.parameter(f"layer{layer}.w", (width, width))], f"layer{layer}.mm")],
                 f"layer{layer}.relu")
    b.layer = None
    y = b.op("matmul", [x, b.parameter("head.w", (width, wide if expensive == "head" else width))], "head")
    add_training_step(b, *weighted_sum_loss(b, y))
    return b.document()


@pytest.mark.parametrize("expensive, layers", [("none", [[0, 1], [2, 3]]), ("embed", [[0, 0], [1, 3]]),
                                               ("head", [[0, 2], [3, 3]])])
def test_an_expensive_embedding_or_head_moves_the_cut(expensive, layers):
    mesh = Mesh.of(dp=2)
    hw = bind_hardware("dgx-h100", pipeline_mesh(mesh, 2))
    pipelined = plan_pipeline(graph_from_json(stack(expensive)), mesh, hw, SolveSettings(deterministic=True),
                              PipelineSettings(2))
    assert [list(part.layers) for part in pipelined.parts] == layers


def test_the_cut_minimises_the_largest_part():
    assert balanced_cuts([1, 1, 1, 1], 2) == ((0, 2), (2, 4))
    assert balanced_cuts([9, 1, 1, 1], 2) == ((0, 1), (1, 4))
    assert balanced_cuts([1, 1, 1, 9], 2) == ((0, 3), (3, 4))
    assert balanced_cuts([4, 1, 1, 1, 1, 1], 3) == ((0, 1), (1, 3), (3, 6))  # not (1, 5), (5, 6): as even as can be
    assert balanced_cuts([1, 1, 1, 1, 1, 1], 4) == ((0, 1), (1, 2), (2, 4), (4, 6))  # the later stages take more
    assert balanced_cuts([5.0], 1) == ((0, 1),)


@pytest.mark.parametrize("extra, layers, flag, said", [
    (("--pipeline", "0"), 4, "--pipeline", "at least 1 stage"),
    (("--pipeline", "5"), 4, "--pipeline", "5 stages need at least 5 layers"),
    (("--pipeline", "5"), 5, "--mesh", "(with --pipeline 5 the machine is pp=5,dp=2)"),
    (("--pipeline", "2", "--schedule", "interleaved:2", "--microbatches", "2"), 3, "--pipeline",
     "2 stages x 2 virtual stages need at least 4 layers"),
    (("--pipeline", "2", "--schedule", "interleaved:2", "--microbatches", "3"), 4, "--microbatches", "multiple"),
    (("--pipeline", "2", "--schedule", "interleaved:1", "--microbatches", "2"), 4, "--schedule", "one is the 1f1b"),
    (("--pipeline", "2", "--schedule", "pipedream"), 4, "--schedule", "unknown schedule"),
    (("--schedule", "gpipe"), 4, "--schedule", "needs --pipeline"),
    (("--trace", "t.json"), 4, "--trace", "needs --pipeline"),
    (("--pipeline", "2", "--layer-once"), 4, "--layer-once", "does not take --pipeline"),
])
def test_wrong_pipeline_flags_are_named(tmp_path, capsys, extra, layers, flag, said):
    config = GPTConfig(layers=layers, hidden=32, heads=2, seq=8, batch=4, vocab=64)
    assert main(pipeline_args(gpt_file(tmp_path, config), *extra)) == 2
    err = capsys.readouterr().err
    assert f"{flag}:" in err and said in err, err


def test_a_graph_without_layers_and_a_mesh_naming_the_stage_axis_are_refused(tmp_path, capsys):
    assert main(pipeline_args(mlp_graph(tmp_path), "--pipeline", "2")) == 2
    err = capsys.readouterr().err
    assert "--pipeline:" in err and "declares no layers" in err, err
    assert main(["plan", gpt_file(tmp_path), "--mesh", "pp=2", "--pipeline", "2"]) == 2
    err = capsys.readouterr().err
    assert "--mesh:" in err and "stage axis" in err, err


def wide_stack(batch: int, width: int) -> dict:
    """Four layers of one matmul each on f32, with their training step."""
    b = GraphBuilder("wide_stack", "f32")
    x = b.input("x", (batch, width), batch_dim=0)
    for layer in range(4):
        b.layer = layer
        x = b.op("relu", [b.op("matmul", [x, b.parameter(f"layer{layer}.w", (width, width))], f"layer{layer}.mm")],
                 f"layer{layer}.relu")
    b.layer = None
    add_training_step(b, *weighted_sum_loss(b, x))
    return b.document()


def test_a_plan_whose_stage_is_over_the_budget_is_solved_again_under_a_shrunk_budget(monkeypatch):
    # 2 x 3000 KiB for the whole graph lets the fastest plan keep every weight and its Adam state
    # whole on both devices; beside GPipe's 8 microbatches of activations a stage then needs 3 MiB
    graph, mesh = graph_from_json(wide_stack(256, 256)), Mesh.of(dp=2)
    hw = bind_hardware("dgx-h100", pipeline_mesh(mesh, 2))
    settings = SolveSettings(deterministic=True, gap_limit=0.2, microbatches=8, memory_budget_bytes=3000 * 1024)
    monkeypatch.setattr(pipeline_plan, "FIT_ROUNDS", 1)
    with pytest.raises(InfeasibleError, match="stage 0 needs 3 MiB"):
        plan_pipeline(graph, mesh, hw, settings, PipelineSettings(2, "gpipe"))
    monkeypatch.undo()
    fitted = plan_pipeline(graph, mesh, hw, settings, PipelineSettings(2, "gpipe"))
    assert all(memory.peak_bytes <= 3000 * 1024 for memory in fitted.memory)
    assert [memory.inflight for memory in fitted.memory] == [8, 8]
    # what the second solve gave up to fit: state split over dp, so less of it per device
    assert sum(m.stored.optimizer_state_bytes for m in fitted.memory) < 2 * 2**20


def test_a_stage_over_the_memory_budget_is_named(tmp_path, capsys):
    # GPipe holds all 8 microbatches' activations: both stages are over 1.2 MiB with them, and
    # neither each stage's memory on its own nor a budget for the whole graph brings them under
    config = GPTConfig(layers=2, hidden=32, heads=2, seq=64, batch=32, vocab=64)
    assert main(pipeline_args(gpt_file(tmp_path, config), "--pipeline", "2", "--microbatches", "8", "--schedule",
                              "gpipe", "--memory-budget", "1.2MiB")) == 3
    err = capsys.readouterr().err
    assert "stage 0 needs" in err and "stage 1 needs" in err and "over the memory budget of 1.2 MiB" in err, err
    assert "8 microbatch chunk(s) in flight" in err


def test_a_graph_beyond_s_budgets_says_the_whole_graph_had_s_budgets(tmp_path, capsys):
    assert main(pipeline_args(gpt_file(tmp_path), "--pipeline", "2", "--memory-budget", "100KiB")) == 3
    err = capsys.readouterr().err
    assert "the whole graph on one stage's mesh, within 2 x the budget" in err and "200 KiB" in err, err


def test_jax_shard_and_dtensor_parallelize_refuse_a_pipelined_plan():
    from autoshard.frontends.jax.shard import shard
    from autoshard.frontends.torch.apply import parallelize

    document = {"mesh": {"axes": [{"name": "dp", "size": 2}]}, "pipeline": {"stage_count": 2}}
    for run, name in ((lambda: shard(lambda x: x, document, None), "shard"),
                      (lambda: parallelize(None, document, None), "parallelize")):
        with pytest.raises(InputError) as error:
            run()
        assert "pipelined" in str(error.value) and name in str(error.value)
        assert "autoshard.frontends.torch.pipeline" in str(error.value)


def test_estimate_prices_a_pipelined_plan_on_its_own_cut_as_plan_did(planned, tmp_path, capsys):
    document, _ = planned
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(document))
    capsys.readouterr()
    assert main(["estimate", gpt_file(tmp_path), "--mesh", "dp=2", "--plan", str(plan_file), "--json"]) == 0
    priced = json.loads(capsys.readouterr().out)
    section, again = document["pipeline"], priced["pipeline"]
    assert again["step_s"] == pytest.approx(section["step_s"], rel=1e-12)
    assert [stage["memory"] for stage in again["stages"]] == [stage["memory"] for stage in section["stages"]]
    assert [[chunk["ops"] for chunk in stage["chunks"]] for stage in again["stages"]] == \
        [[chunk["ops"] for chunk in stage["chunks"]] for stage in section["stages"]]
    # the cut is the plan's, not made again: an op moved to the other stage is priced there
    moved = json.loads(json.dumps(document))
    first, second = (stage["chunks"][0]["ops"] for stage in moved["pipeline"]["stages"])
    op = first.pop()
    second.insert(0, op)
    plan_file.write_text(json.dumps(moved))
    assert main(["estimate", gpt_file(tmp_path), "--mesh", "dp=2", "--plan", str(plan_file), "--json"]) == 0
    stages = json.loads(capsys.readouterr().out)["pipeline"]["stages"]
    assert op in stages[1]["chunks"][0]["ops"] and op not in stages[0]["chunks"][0]["ops"]
    assert main(["estimate", gpt_file(tmp_path), "--mesh", "dp=2", "--plan", str(plan_file)]) == 0
    out = capsys.readouterr().out
    assert "pipeline: 2 stages on 4 devices, schedule 1f1b, 4 microbatches" in out and "stage 1 (devices 2-3)" in out
