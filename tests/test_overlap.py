"""Communication behind compute, by tensor role: a data-parallel step's gradient all-reduces run
behind its compute, a tensor-parallel forward's activation all-reduces do not, and the report's
overlapped step is max(compute, hideable) + exposed, recomputed here from its per-op entries; a
pipelined step hides its tail's gradient reduction behind the last microbatch's backward only."""

from __future__ import annotations

import json
import math

import pytest

from autoshard.cli.main import main
from autoshard.graph.model import Graph
from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.models.gpt import GPTConfig, gpt
from autoshard.ops.loops import loop_position
from autoshard.phases import PhaseTimes
from autoshard.pipeline import simulate_pipeline, stage_orders
from autoshard.planning.hardware import bind_hardware
from autoshard.planning.make_plan import PlanResult, SolveSettings, make_plan
from autoshard.planning.microbatches import microbatch
from autoshard.planning.options import ShardingOption
from autoshard.planning.pipeline_plan import pipeline_mesh, price_pipeline
from autoshard.planning.pipeline_stages import op_positions
from autoshard.planning.pipeline_work import work_kinds
from autoshard.planning.plan import Plan, plan_to_json
from autoshard.planning.report import estimate
from autoshard.planning.roles import dim_labels, tensor_roles
from autoshard.sharding import Sharding

GPT = GPTConfig(layers=2, hidden=256, heads=4, seq=64, batch=8, vocab=512)


def data_parallel(graph: Graph, mesh: Mesh) -> Plan:
    """Every forward and backward op split on its batch loop over `dp`, the parameters and the
    optimizer whole on every device: the classic data-parallel step."""
    labels = dim_labels(graph)
    phases = graph.phases
    options = {}
    for op in graph.ops:
        loops: list[tuple[str, ...]] = [()] * op.nest.num_loops
        if phases[op.name] != "optimizer":
            batch = [loop for loop in range(op.nest.num_loops)
                     if any((dim := loop_position(m, loop, op.nest.extents)) is not None and dim >= 0
                            and labels[op.operands[i]][dim] == "batch" for i, m in enumerate(op.nest.maps))]
            if batch:
                loops[batch[0]] = ("dp",)
        options[op.name] = ShardingOption(tuple(loops))
    storage = {}
    for tensor in graph.tensors.values():
        if tensor.role not in ("input", "parameter"):
            continue
        split = [["dp"] if dim == tensor.batch_dim else [] for dim in range(len(tensor.shape))]
        storage[tensor.name] = Sharding.replicated().with_split(split)
    return Plan(graph, mesh, options, storage)


def expected_step(report_json: dict, roles: dict[str, str]) -> tuple[float, float]:
    """(hideable seconds, max(compute, hideable) + exposed) from the per-op entries and each
    resharding's steps alone."""
    compute = sum(entry["compute_s"] for entry in report_json["ops"])
    communication = hideable = 0.0
    for entry in report_json["reshardings"]:
        times = entry.get("runs", 1)
        for step in entry["steps"]:
            role = roles[entry["tensor"]]
            if (role == "gradient" and step["kind"] in ("all_reduce", "reduce_scatter")) or (
                    role == "parameter" and step["kind"] == "all_gather"):
                hideable += step["seconds"] * times
            communication += step["seconds"] * times
    return hideable, max(compute, hideable) + communication - hideable


def test_a_data_parallel_step_hides_its_gradient_all_reduces():
    mesh = Mesh.parse("dp=4")
    graph = graph_from_json(gpt(GPT, training=True), mesh)
    report = estimate(data_parallel(graph, mesh), bind_hardware("dgx-h100", mesh))
    roles = tensor_roles(graph)
    reductions = [entry for entry in report.reshardings if roles[entry["tensor"]] == "gradient"
                  and any(step["kind"] == "all_reduce" for step in entry["steps"])]
    # one all_reduce over dp per parameter's gradient (the step has 37 parameters)
    assert len(reductions) == len(graph.gradients) == 37
    hideable, step = expected_step(report.to_json(), roles)
    assert hideable == pytest.approx(sum(entry["seconds"] for entry in reductions))
    assert report.overlap.hideable_s == pytest.approx(hideable)
    assert report.overlap.step_s == pytest.approx(step)
    assert report.overlap.step_s < report.step_s  # the all-reduces run behind the backward
    totals = report.to_json()["totals"]
    assert totals["hidden_s"] == pytest.approx(min(totals["compute_s"], hideable))
    assert totals["overlapped_step_s"] == pytest.approx(totals["compute_s"] + totals["exposed_s"])
    for axis, seconds in totals["communication_s_per_axis"].items():
        assert totals["hidden_s_per_axis"][axis] + totals["exposed_s_per_axis"][axis] == pytest.approx(seconds)
    assert totals["hidden_s_per_axis"]["dp"] == pytest.approx(totals["hidden_s"])


def test_a_tensor_parallel_forward_exposes_its_activation_all_reduces():
    document = gpt(GPTConfig(layers=1, hidden=256, heads=4, seq=64, batch=8, vocab=512))
    # Megatron's MLP: fc1 column-parallel, fc2 row-parallel, so fc2's partial sums are all-reduced
    pins = {"layer0.mlp.fc1.w": [[], ["tp"]], "layer0.mlp.fc2.w": [["tp"], []],
            "layer0.mlp.fc1": [[], [], ["tp"]], "layer0.mlp.fc2.bias": [[], [], []]}
    document = dict(document, constraints=[{"tensor": t, "split_axes": axes, "required": True}
                                           for t, axes in pins.items()])
    mesh = Mesh.parse("tp=2")
    graph = graph_from_json(document, mesh)
    hw = bind_hardware("dgx-h100", mesh)
    result = make_plan(graph, mesh, hw, SolveSettings(time_limit_s=30, deterministic=True, workers=1))
    report = result.report
    roles = tensor_roles(graph)
    all_reduces = [entry for entry in report.reshardings if any(s["kind"] == "all_reduce" for s in entry["steps"])]
    assert all_reduces and {roles[entry["tensor"]] for entry in all_reduces} == {"activation"}
    hideable, step = expected_step(report.to_json(), roles)
    assert report.overlap.hideable_s == hideable == 0.0
    assert report.overlap.exposed_s == pytest.approx(report.communication_s) and report.communication_s > 0
    assert report.overlap.step_s == pytest.approx(report.step_s) == pytest.approx(step)
    assert report.overlap.exposed_s_per_axis == pytest.approx(report.seconds_per_axis)


def test_estimate_json_and_text_give_the_hidden_and_exposed_seconds(tmp_path, capsys):
    mesh = Mesh.parse("dp=4")
    document = gpt(GPT, training=True)
    graph = graph_from_json(document, mesh)
    plan = data_parallel(graph, mesh)
    (tmp_path / "gpt.json").write_text(json.dumps(document))
    (tmp_path / "plan.json").write_text(json.dumps(plan_to_json(plan)))
    args = ["estimate", str(tmp_path / "gpt.json"), "--mesh", "dp=4", "--topology", "dgx-h100",
            "--plan", str(tmp_path / "plan.json")]
    assert main(args + ["--json"]) == 0
    totals = json.loads(capsys.readouterr().out)["totals"]
    report = estimate(plan, bind_hardware("dgx-h100", mesh))
    assert totals["hidden_s"] == pytest.approx(report.overlap.hidden_s) and totals["hidden_s"] > 0
    assert totals["exposed_s"] == pytest.approx(report.communication_s - report.overlap.hidden_s)
    assert totals["overlapped_step_s"] == pytest.approx(max(totals["compute_s"], totals["hideable_s"])
                                                        + totals["communication_s"] - totals["hideable_s"])
    assert set(totals["hidden_s_per_axis"]) == set(totals["exposed_s_per_axis"]) == {"dp"}
    assert main(args) == 0
    text = capsys.readouterr().out
    assert f"overlapped: step {report.overlap.step_s * 1e3:.4g} ms" in text
    assert f"(hidden {report.overlap.hidden_s_per_axis['dp'] * 1e3:.4g} ms" in text


def test_a_pipelined_step_hides_its_tail_reduction_behind_the_last_microbatch_backward_only():
    mesh = Mesh.parse("dp=2")
    microbatching = microbatch(graph_from_json(gpt(GPTConfig(layers=4, hidden=256, heads=4, seq=64, batch=8,
                                                              vocab=512), training=True), mesh), 4)
    graph, orders = microbatching.graph, stage_orders("1f1b", 2, 4, 1)
    plan = data_parallel(graph, mesh)
    hw = bind_hardware("dgx-h100", pipeline_mesh(mesh, 2))
    report = estimate(plan, hw, microbatching)
    pipelined = price_pipeline(PlanResult(plan, report, {}, PhaseTimes(), microbatching), mesh, hw, orders, math.inf)
    kinds, roles = work_kinds(graph, op_positions(graph)), tensor_roles(graph)
    stage_of = {name: part.stage for part in pipelined.parts for name in part.ops}
    reductions, backward = [0.0, 0.0], [0.0, 0.0]
    for entry in report.reshardings:
        if entry["consumer"] in kinds and kinds[entry["consumer"]] != "tail":
            # nothing inside the microbatches runs behind compute: parameters are whole, never gathered
            assert not any(roles[entry["tensor"]] == "parameter" and s["kind"] == "all_gather" for s in entry["steps"])
        elif roles[entry["tensor"]] == "gradient":
            reductions[stage_of[entry["consumer"]]] += sum(s["seconds"] for s in entry["steps"]
                                                           if s["kind"] == "all_reduce")
    for entry in report.ops:
        if kinds[entry["op"]] in ("B", "W"):
            backward[stage_of[entry["op"]]] += entry["compute_s"] / entry["runs"]  # one microbatch's
    assert all(r > b > 0 for r, b in zip(reductions, backward))  # more to reduce than one backward hides
    assert pipelined.tail_hidden_s == pytest.approx(backward)
    tail = dict(pipelined.tail_s, **{"gradient reduction": [t - h for t, h in
                                                            zip(pipelined.tail_s["gradient reduction"], backward)]})
    table = [[[getattr(p, f"{kind}_s")] for p in pipelined.parts] for kind in ("forward", "backward", "weight")]
    expected = simulate_pipeline(orders, *table, transfer_s=[pipelined.transfer_s[d] for d in ("forward", "backward")],
                                 tail_s=tail)
    assert pipelined.overlapped.step_s == pytest.approx(expected.step_s)
    assert pipelined.overlapped.step_s < pipelined.timeline.step_s
    section = pipelined.to_json()
    assert section["overlapped_step_s"] == pytest.approx(expected.step_s)
    assert [stage["tail_hidden_s"] for stage in section["stages"]] == pytest.approx(backward)


def test_a_microbatched_step_hides_its_gradient_reductions_behind_the_last_microbatch_backward_only():
    mesh = Mesh.parse("dp=4")
    microbatching = microbatch(graph_from_json(gpt(GPT, training=True), mesh), 4)
    graph = microbatching.graph
    report = estimate(data_parallel(graph, mesh), bind_hardware("dgx-h100", mesh), microbatching)
    roles, phases = tensor_roles(graph), graph.phases
    reductions = sum(s["seconds"] for entry in report.reshardings if roles[entry["tensor"]] == "gradient"
                     for s in entry["steps"] if s["kind"] == "all_reduce")
    assert all(entry["runs"] == 1 for entry in report.reshardings if roles[entry["tensor"]] == "gradient")
    last_backward = sum(entry["compute_s"] for entry in report.ops if phases[entry["op"]] == "backward") / 4
    assert reductions > last_backward > 0
    assert report.overlap.hideable_s == pytest.approx(last_backward)  # the rest runs after the backward, exposed
    assert report.overlap.hidden_s == pytest.approx(last_backward)
    assert report.overlap.step_s == pytest.approx(report.step_s - last_backward)


def test_search_ranks_by_the_additive_step_and_gives_the_overlapped_one_beside_it(tmp_path):
    graph = tmp_path / "mlp.json"
    assert main(["generate", "mlp", "--training", "--batch", "4096", "--hidden", "1024", "--ffn", "4096",
                 "-o", str(graph)]) == 0
    assert main(["search", str(graph), "--devices", "4", "--topology", "dgx-h100", "--deterministic",
                 "--verify", "never", "-o", str(tmp_path / "out")]) == 0
    rows = json.loads((tmp_path / "out" / "ranking.json").read_text())["ranking"]
    totals = json.loads((tmp_path / "out" / "plan.json").read_text())["totals"]
    assert rows[0]["step_s"] == pytest.approx(totals["step_s"])
    assert rows[0]["overlapped_step_s"] == pytest.approx(totals["overlapped_step_s"])
    assert all(row["overlapped_step_s"] <= row["step_s"] for row in rows if "step_s" in row)
