"""A training step planned as M microbatches: forward and backward per microbatch on 1/M of the
batch, gradients accumulated, the data-parallel gradient reduction and the optimizer once per
step; priced, held in memory and executed that way."""

from __future__ import annotations

import json

import numpy as np
import pytest

from autoshard.cli.main import main
from autoshard.errors import InputError
from autoshard.graph.builder import GraphBuilder
from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.models.gpt import GPTConfig, gpt
from autoshard.models.mlp import MLPConfig, mlp
from autoshard.ops.loops import loop_position
from autoshard.planning.formulation import formulate
from autoshard.planning.hardware import bind_hardware
from autoshard.planning.microbatches import microbatch, repeat_formulation
from autoshard.planning.options import ShardingOption
from autoshard.planning.plan import Plan
from autoshard.planning.report import delivered_shardings, estimate, memory_timeline
from autoshard.planning.roles import dim_labels
from autoshard.sharding import Sharding
from autoshard.sim.microbatch import per_step_instructions, simulate_microbatched
from autoshard.solver import score
from autoshard.spmd.program import Communicate, LocalOp, partition

CONFIG = GPTConfig(layers=2, hidden=32, heads=2, seq=64, batch=8, vocab=64)


@pytest.fixture(scope="module")
def step():
    return graph_from_json(gpt(CONFIG, training=True))


def data_parallel_plan(graph, mesh: Mesh, axis: str = "dp") -> Plan:
    """Every loop over the batch split over `axis`; parameters and state replicated."""
    labels = dim_labels(graph)
    options = {}
    for op in graph.ops:
        loops = []
        for loop in range(op.nest.num_loops):
            linked = [labels[op.operands[i]][dim] for i, m in enumerate(op.nest.maps)
                      if (dim := loop_position(m, loop, op.nest.extents)) is not None and dim >= 0]
            loops.append((axis,) if "batch" in linked else ())
        options[op.name] = ShardingOption(tuple(loops))
    storage = {t.name: Sharding(tuple((axis,) if label == "batch" else () for label in labels[t.name]))
               for t in graph.tensors.values() if t.role != "intermediate"}
    return Plan(graph, mesh, options, storage)


def test_the_step_on_one_microbatch_divides_every_batch_dim_and_nothing_else(step):
    m = microbatch(step, 4)
    assert m.graph.tensors["ids"].shape == (2, 64) and m.graph.tensors["labels"].shape == (2, 64)
    assert m.graph.tensors["layer0.attn.q"].shape == (2, 64, 32)
    assert m.graph.op_by_name["layer0.attn.q.split"].attrs["shape"] == [2, 64, 2, 16]
    for t in step.tensors.values():
        if t.role == "parameter" or t.grad_of or t.updates:
            assert m.graph.tensors[t.name].shape == t.shape, t.name
    phases = step.phases
    assert {m.repeats[name] for name, phase in phases.items() if phase != "optimizer"} == {4}
    assert {m.repeats[name] for name, phase in phases.items() if phase == "optimizer"} == {1}
    # bf16 gradients accumulate in f32
    assert set(m.accumulated) == set(step.gradients.values()) and set(m.accumulated.values()) == {2}


def test_microbatches_that_do_not_divide_the_batch_or_a_graph_without_one_are_refused(step):
    with pytest.raises(InputError) as error:
        microbatch(step, 3)
    assert {p.where for p in error.value.problems} == {"/tensors/ids/batch_dim", "/tensors/labels/batch_dim"}
    with pytest.raises(InputError, match="positive integer"):
        microbatch(step, 0)
    document = gpt(CONFIG, training=True)
    for entry in document["tensors"].values():
        entry.pop("batch_dim", None)
    with pytest.raises(InputError, match="declares no batch dim"):
        microbatch(graph_from_json(document), 2)


def test_a_slice_keeping_the_batch_whole_keeps_a_microbatch_whole():
    """As an imported program's q, k and v split off one projection: the slice's limits over the
    batch dim follow the microbatch, its other limits stay."""
    builder = GraphBuilder("split", "f32")
    qkv = builder.input("qkv", (8, 6), batch_dim=0)
    builder.mark_outputs(builder.op("slice", [qkv], "q", starts=[0, 2], limits=[8, 4]))
    one = microbatch(graph_from_json(builder.document()), 4).graph
    assert one.op_by_name["q"].attrs["limits"] == [2, 4] and one.tensors["q"].shape == (2, 2)


def test_gradient_reductions_are_priced_once_per_step_and_activations_once_per_microbatch(step):
    mesh = Mesh.parse("dp=2")
    hw = bind_hardware("dgx-h100", mesh)
    whole = estimate(data_parallel_plan(step, mesh), hw)
    m = microbatch(step, 4)
    split = estimate(data_parallel_plan(m.graph, mesh), hw, m)
    gradients = set(step.gradients.values())
    reductions = {e["tensor"]: e for e in whole.reshardings if e["tensor"] in gradients}
    assert len(reductions) == len(gradients)  # each gradient is a partial sum over dp
    for entry in split.reshardings:
        if entry["tensor"] in gradients:
            assert entry["runs"] == 1 and entry["seconds"] == reductions[entry["tensor"]]["seconds"]
            assert [s["kind"] for s in entry["steps"]] == [s["kind"] for s in reductions[entry["tensor"]]["steps"]]
    assert {e["runs"] for e in split.reshardings if e["tensor"] not in gradients} <= {4}
    # compute: each op of forward and backward on a quarter of the batch, four times
    runs = {e["op"]: e["runs"] for e in split.ops}
    assert {runs[name] for name, phase in step.phases.items() if phase == "optimizer"} == {1}
    assert split.compute_s >= whole.compute_s * 0.999
    # memory: activations of one microbatch, plus an f32 accumulator per bf16 gradient
    assert split.peak_memory_bytes < whole.peak_memory_bytes
    usage, _ = memory_timeline(data_parallel_plan(m.graph, mesh), accumulated=m.accumulated)
    state = sum(t.bytes for t in step.tensors_with_role("parameter"))
    accumulators = sum(2 * step.tensors[g].bytes for g in gradients)
    inputs = sum(t.bytes for t in m.graph.tensors.values() if t.role == "input" and t.batch_dim is not None) // 2
    scalars = sum(t.bytes for t in m.graph.tensors.values() if t.role == "input" and t.batch_dim is None)
    first = m.graph.tensors[m.graph.order[0].outputs[0]].bytes // 2
    assert usage[0] == state + accumulators + inputs + scalars + first


def test_the_solvers_objective_is_the_estimate_of_its_plan(step):
    mesh = Mesh.parse("dp=2")
    hw = bind_hardware("dgx-h100", mesh)
    m = microbatch(step, 4)
    plan = data_parallel_plan(m.graph, mesh)
    formulation = repeat_formulation(formulate(m.graph, mesh, hw), m)
    picks = formulation.solution(plan, delivered_shardings(plan, hw.collective_seconds))
    objective_s = score(formulation.problem, np.array(picks)).cost / 1e12
    assert objective_s == pytest.approx(estimate(plan, hw, m).step_s, rel=1e-4)


@pytest.mark.parametrize("build, mesh_text", [
    (lambda: gpt(GPTConfig(layers=2, hidden=16, heads=2, seq=4, batch=4, vocab=32, dtype="f32"), training=True), "dp=2"),
    (lambda: mlp(MLPConfig(layers=2, batch=8, hidden=8, ffn=16, dtype="f32"), training=True), "dp=2,tp=2"),
])
def test_the_simulator_runs_each_microbatch_then_the_optimizer_once_on_the_summed_gradients(build, mesh_text):
    graph = graph_from_json(build())
    mesh = Mesh.parse(mesh_text)
    m = microbatch(graph, 2)
    program = partition(data_parallel_plan(m.graph, mesh))
    once = per_step_instructions(program)
    gradients = set(graph.gradients.values())
    for position, item in enumerate(program.body):
        if isinstance(item, LocalOp):
            assert (position in once) == (m.repeats[item.op.name] == 1), item.op.name
        elif item.input.tensor in gradients and item.step.kind == "all_reduce":
            assert position in once, "a gradient is reduced over data replicas once, after accumulation"
    assert any(isinstance(program.body[p], Communicate) for p in once)
    verdict = simulate_microbatched(program, m)
    assert verdict.passed, verdict.first_divergence
    # each microbatch's values and the accumulated gradients are checked, then the optimizer's once
    per_microbatch = sum(len(item.outputs) for position, item in enumerate(program.body) if position not in once)
    per_step = sum(len(item.outputs) for position, item in enumerate(program.body) if position in once)
    accumulated = {v.id for p in once for v in program.body[p].inputs} - {v.id for p in once for v in program.body[p].outputs}
    accumulated -= {v.id for v in program.arguments}
    assert verdict.values_checked == 2 * per_microbatch + len(accumulated) + per_step


def test_plan_estimate_and_simulate_commands_keep_the_microbatches(tmp_path, capsys):
    path = tmp_path / "g.json"
    path.write_text(json.dumps(gpt(GPTConfig(layers=1, hidden=16, heads=2, seq=4, batch=4, vocab=32, dtype="f32"),
                                   training=True)))
    out = tmp_path / "plan"
    assert main(["plan", str(path), "--mesh", "dp=2", "--topology", "dgx-h100", "--microbatches", "2",
                 "--time-limit", "5", "--deterministic", "--verify", "always", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "2 microbatches" in printed and "simulator: PASS" in printed
    document = json.loads((out / "plan.json").read_text())
    assert document["microbatches"] == 2
    assert main(["estimate", str(path), "--mesh", "dp=2", "--topology", "dgx-h100", "--plan", str(out / "plan.json"),
                 "--json"]) == 0
    priced = json.loads(capsys.readouterr().out)
    assert priced["totals"]["step_s"] == pytest.approx(document["totals"]["step_s"])
    assert main(["simulate", str(path), "--plan", str(out / "plan.json")]) == 0
    assert capsys.readouterr().out.startswith("PASS")
    assert main(["plan", str(path), "--mesh", "dp=2", "--topology", "dgx-h100", "--microbatches", "3"]) == 2
    assert "3 microbatches do not divide" in capsys.readouterr().err


def test_a_stored_parameter_gathered_for_the_forward_and_the_optimizer_is_not_summed(step):
    """Weights stored split and gathered once for their readers, the optimizer among them: the
    gathered weight is made per microbatch (the forward reads it) and read once per step, but it
    is the same in every microbatch; summed like a gradient it was M times the weight."""
    mesh = Mesh.parse("dp=2")
    m = microbatch(step, 2)
    plan = data_parallel_plan(m.graph, mesh)
    params = set(step.gradients)
    storage = {name: Sharding((("dp",),)) if name in params and m.graph.tensors[name].shape[0] % 2 == 0 else sharding
               for name, sharding in plan.storage.items()}
    program = partition(Plan(m.graph, mesh, plan.options, storage))
    once = per_step_instructions(program)
    gathered = [item for position, item in enumerate(program.body) if isinstance(item, Communicate)
                and item.input.tensor in params and position not in once]
    read_once = {v.id for p in once for v in program.body[p].inputs}
    assert any(item.output.id in read_once for item in gathered)  # read by the forward and the optimizer
    verdict = simulate_microbatched(program, m)
    assert verdict.passed, verdict.first_divergence
