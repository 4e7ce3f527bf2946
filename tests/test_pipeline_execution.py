"""A pipelined GPT training step executed: the simulator runs every microbatch through every
stage in the schedule's order and matches the unsharded step; each stage's items and in-flight
peak are the schedule's (values alone cannot tell a schedule from whole-batch execution); the
partitioned IR is one function per virtual stage with the transfers as send/recv, verified by
mlir-opt; and the CLI's plan, simulate and emit run a pipelined plan.json that way."""

from __future__ import annotations

import json
import re

import pytest

from autoshard.cli.main import main
from autoshard.errors import InputError
from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.mlir import emit_pipelined, verify
from autoshard.models.gpt import GPTConfig, gpt
from autoshard.pipeline import inflight_peaks, parse_schedule, stage_orders
from autoshard.planning.hardware import bind_hardware
from autoshard.planning.make_plan import SolveSettings
from autoshard.planning.pipeline_cut import PipelineCut, read_cut
from autoshard.planning.pipeline_plan import PipelineSettings, pipeline_mesh, plan_pipeline
from autoshard.sim.pipelined import simulate_pipelined
from autoshard.spmd.program import partition
from autoshard.spmd.staged import stage_program

GPT = GPTConfig(layers=4, hidden=64, heads=4, seq=8, batch=8, vocab=64)
STAGES, MICROBATCHES = 2, 4
SCHEDULES = ("gpipe", "1f1b", "interleaved:2", "zb-h1")


@pytest.fixture(scope="module", params=SCHEDULES)
def pipelined(request):
    """The step planned on 2 stages of dp=2 for one schedule, cut into its slots and run."""
    name, chunks = parse_schedule(request.param)
    mesh = Mesh.of(dp=2)
    hw = bind_hardware("dgx-h100", pipeline_mesh(mesh, STAGES))
    plan = plan_pipeline(graph_from_json(gpt(GPT, training=True)), mesh, hw,
                         SolveSettings(deterministic=True, microbatches=MICROBATCHES),
                         PipelineSettings(STAGES, name, chunks))
    microbatching = plan.result.microbatching
    staged = stage_program(partition(plan.result.plan), plan.cut)
    return staged, simulate_pipelined(staged, microbatching)


def test_the_values_equal_the_unsharded_steps(pipelined):
    _, run = pipelined
    assert run.verdict.passed, run.verdict.summary()
    assert run.verdict.values_checked > 1000


def test_each_stage_runs_its_items_in_the_schedules_order(pipelined):
    staged, run = pipelined
    orders = staged.orders
    assert run.ran == orders.orders
    assert run.ran == stage_orders(orders.schedule, STAGES, MICROBATCHES, orders.chunks).orders


def test_each_stage_holds_the_schedules_microbatches_in_flight(pipelined):
    staged, run = pipelined
    assert run.inflight_peaks == inflight_peaks(staged.orders)
    # GPipe holds every microbatch, 1F1B stage i S - i, ZB-H1 S; interleaved stage 0 S V (1 + (S - 1)/(S V)) chunks
    expected = {"gpipe": (4, 4), "1f1b": (2, 1), "zb-h1": (2, 2), "interleaved": (5, 3)}[staged.orders.schedule]
    assert run.inflight_peaks == expected


def test_the_residual_stream_and_its_gradient_cross_every_boundary_once_per_microbatch(pipelined):
    staged, run = pipelined
    boundaries = staged.orders.virtual_stages - 1
    assert len(run.transfers) == 2 * MICROBATCHES * boundaries  # as the planner prices them
    for transfer in run.transfers:
        forward = "grad" not in transfer.tensor
        assert (transfer.target - transfer.source) % STAGES == (1 if forward else STAGES - 1)


@pytest.mark.parametrize("dialect", ["mesh", "shard"])
def test_the_ir_is_one_function_per_virtual_stage_with_send_and_recv_between_stages(pipelined, dialect):
    staged, _ = pipelined
    orders = staged.orders
    text = emit_pipelined(staged, dialect)
    verify(text, dialect)
    functions = re.split(r"^func\.func ", text, flags=re.MULTILINE)[1:]
    assert len(functions) == orders.virtual_stages + STAGES  # and each stage's once-per-step part
    for virtual, function in enumerate(functions[:orders.virtual_stages]):
        first, last = virtual == 0, virtual == orders.virtual_stages - 1
        sends = re.findall(rf"{dialect}\.send .* on @pipeline \w+ = \[0\] destination = \[(\d)\]", function)
        receives = re.findall(rf"{dialect}\.recv .* on @pipeline \w+ = \[0\] source = \[(\d)\]", function)
        after, before = str((virtual + 1) % STAGES), str((virtual - 1) % STAGES)
        # forward: the activation from the virtual stage before, to the one after; backward the other way
        assert sorted(receives) == sorted(([] if first else [before]) + ([] if last else [after]))
        assert sorted(sends) == sorted(([] if last else [after]) + ([] if first else [before]))
    assert not re.search(r"\.(send|recv) ", "".join(functions[orders.virtual_stages:]))


def test_an_op_placed_before_what_it_reads_is_refused_by_name(pipelined):
    staged, _ = pipelined
    last = staged.orders.virtual_stages - 1
    part_of = {op.name: 0 if op.name == "logits" else last for op in staged.program.graph.ops}
    with pytest.raises(InputError, match=rf"logits on virtual stage 0 \(F\) reads .* made on virtual stage {last} \(F\)"):
        stage_program(staged.program, PipelineCut(staged.orders, part_of))


@pytest.fixture(scope="module")
def planned_file(tmp_path_factory):
    """`autoshard plan --pipeline 2` of the step with ZB-H1, verified always, its partitioned IR written."""
    folder = tmp_path_factory.mktemp("pipelined_cli")
    graph = folder / "gpt.json"
    graph.write_text(json.dumps(gpt(GPT, training=True)))
    assert main(["plan", str(graph), "--mesh", "dp=2", "--deterministic", "--pipeline", str(STAGES), "--microbatches",
                 str(MICROBATCHES), "--schedule", "zb-h1", "--verify", "always", "--emit", "partitioned",
                 "-o", str(folder / "out")]) == 0
    return graph, folder / "out"


def _as_run(orders) -> list[list[str]]:
    return [[repr(item) for item in order] for order in orders.orders]


def test_plan_verifies_its_pipelined_plan_in_the_schedules_order(planned_file):
    _, out = planned_file
    verification = json.loads((out / "plan.json").read_text())["verification"]
    orders = stage_orders("zb-h1", STAGES, MICROBATCHES)
    assert verification["status"] == "passed", verification["summary"]
    assert verification["pipeline"] == {"ran": _as_run(orders), "inflight_peaks": list(inflight_peaks(orders)),
                                        "transfers": 2 * MICROBATCHES}
    text = (out / "partitioned.mlir").read_text()
    assert (text.count("func.func "), text.count("mesh.send "), text.count("mesh.recv ")) == (2 * STAGES, 2, 2)


def test_simulate_runs_a_pipelined_plan_json_stage_by_stage(planned_file, capsys):
    graph, out = planned_file
    capsys.readouterr()
    assert main(["simulate", str(graph), "--plan", str(out / "plan.json"), "--json"]) == 0
    verdict = json.loads(capsys.readouterr().out)
    assert verdict["passed"]
    assert verdict["pipeline"]["ran"] == _as_run(stage_orders("zb-h1", STAGES, MICROBATCHES))


def test_emit_writes_a_pipelined_plan_json_as_one_function_per_stage(planned_file, tmp_path):
    graph, out = planned_file
    written = tmp_path / "shard.mlir"
    assert main(["emit", str(graph), "--plan", str(out / "plan.json"), "--stage", "partitioned", "--dialect", "shard",
                 "-o", str(written)]) == 0
    text = written.read_text()
    verify(text, "shard")
    assert re.findall(r"^func\.func @(\w+)\(", text, flags=re.MULTILINE) == [
        "gpt_4l_64h_training_stage0", "gpt_4l_64h_training_stage1",
        "gpt_4l_64h_training_stage0_step", "gpt_4l_64h_training_stage1_step"]
    assert (text.count("shard.send "), text.count("shard.recv ")) == (2, 2)


def test_a_pipeline_section_that_does_not_fit_the_graph_is_refused_by_pointer(planned_file, tmp_path):
    graph, out = planned_file
    document = json.loads((out / "plan.json").read_text())
    document["pipeline"]["stages"][0]["chunks"][0]["ops"].append("no_such_op")
    document["pipeline"]["stages"][1]["chunks"][0]["ops"].remove("logits")
    with pytest.raises(InputError) as error:
        read_cut(document, graph_from_json(json.loads(graph.read_text())))
    assert [p.where for p in error.value.problems] == ["/pipeline/stages/0/chunks/0/ops"]
    document["pipeline"]["stages"][0]["chunks"][0]["ops"].pop()
    with pytest.raises(InputError, match="no stage runs op\\(s\\) 'logits'"):
        read_cut(document, graph_from_json(json.loads(graph.read_text())))


def test_virtual_stages_on_one_stage_hand_over_in_place():
    """Interleaved on a single stage: its two chunks pass values as function results and
    arguments, with no transfer and no send/recv."""
    mesh = Mesh.of(dp=2)
    plan = plan_pipeline(graph_from_json(gpt(GPT, training=True)), mesh, bind_hardware("dgx-h100", pipeline_mesh(mesh, 1)),
                         SolveSettings(deterministic=True, microbatches=2), PipelineSettings(1, "interleaved", 2))
    staged = stage_program(partition(plan.result.plan), plan.cut)
    run = simulate_pipelined(staged, plan.result.microbatching)
    assert run.verdict.passed, run.verdict.summary()
    assert (run.ran, run.inflight_peaks, run.transfers) == (plan.orders.orders, inflight_peaks(plan.orders), ())
    text = emit_pipelined(staged)
    verify(text, "mesh")
    assert (text.count("func.func "), text.count("mesh.send "), text.count("mesh.recv ")) == (3, 0, 0)
