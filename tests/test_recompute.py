"""Activation recomputation (`plan --recompute`): the recomputed ops are in the step, what the
forward kept ends there, the kept bytes drop to what Korthikanti et al. count (beside the masks,
which our graphs take as inputs), the copies' compute is priced in the backward, and plans made
with it compute what the graph computes, in the simulator and the partitioned IR."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_fuzz import run_cli
from test_megatron_layer import CONFIG, A, B, H, S

from autoshard import bind_hardware, estimate
from autoshard.errors import InputError
from autoshard.graph.model import Graph, live_ranges
from autoshard.cli.plan import recomputations
from autoshard.graph.recompute import PREFIX, with_recomputation
from autoshard.graph.schema import graph_from_json, graph_to_json
from autoshard.mesh import Mesh
from autoshard.models import GPTConfig, gpt
from autoshard.planning.kept import kept_activation_bytes
from autoshard.planning.options import ShardingOption
from autoshard.planning.plan import Plan
from autoshard.sharding import Sharding

MESH = Mesh.of(tp=1)
SBH, ASSB = S * B * H, A * S * S * B
MASKS = ASSB + 2 * SBH  # one byte an element: the softmax's dropout mask and the two residual ones
CAUSAL_BIAS = S * S * 2  # read again by the recomputed masking


def recomputed_ops(graph: Graph) -> list:
    return [op for op in graph.ops if op.name.startswith(PREFIX)]


def training_step_file(directory: Path) -> Path:
    path = directory / "g.json"
    path.write_text(json.dumps(gpt(CONFIG, training=True)))
    return path


def planned(directory: Path, command: str, *flags: str) -> tuple[dict, str]:
    """`autoshard COMMAND` run on the training step with FLAGS, writing into DIRECTORY/out: the
    plan.json it wrote and what it said on stderr."""
    code, out, err = run_cli(command, str(training_step_file(directory)), *flags, "-o", str(directory / "out"))
    assert code == 0, err
    return json.loads((directory / "out" / "plan.json").read_text()), err


def replicated(graph: Graph) -> Plan:
    return Plan(graph, MESH, {op.name: ShardingOption.replicated(op.nest.num_loops) for op in graph.ops},
                {t.name: Sharding() for t in graph.tensors.values() if t.role != "intermediate"})


@pytest.fixture(scope="module")
def steps() -> dict[str, Graph]:
    graph = graph_from_json(gpt(CONFIG, training=True), MESH)
    return {mode: with_recomputation(graph, mode, MESH) for mode in ("none", "selective", "full")}


def test_the_layers_keep_what_the_paper_counts_beside_the_masks(steps):
    kept = {mode: [kept_activation_bytes(replicated(graph), layer) for layer in range(CONFIG.layers)]
            for mode, graph in steps.items()}
    assert kept["none"] == [SBH * (34 + 5 * A * S / H)] * CONFIG.layers
    assert kept["selective"] == [34 * SBH + ASSB + CAUSAL_BIAS] * CONFIG.layers  # 34sbh and its mask
    assert kept["full"] == [2 * SBH + MASKS + CAUSAL_BIAS] * CONFIG.layers  # 2sbh: the layer's input


def test_recomputed_values_are_copies_run_in_the_backward_and_the_kept_ones_end_in_the_forward(steps):
    for mode, copied in (("selective", {"attn.scores", "attn.masked", "attn.softmax", "attn.attn_dropout.kept",
                                        "attn.attn_dropout"}),
                         ("full", None)):
        graph = steps[mode]
        order = list(graph.order)
        step = {op.name: i for i, op in enumerate(order)}
        ranges = live_ranges(graph, order)
        phases = graph.phases
        for layer in range(CONFIG.layers):
            copies = [op for op in recomputed_ops(graph) if op.layer == layer]
            if copied is not None:
                assert {op.name.removeprefix(f"{PREFIX}layer{layer}.") for op in copies} == copied
            first_backward = min(step[op.name] for op in order if op.layer == layer and phases[op.name] == "backward")
            last_forward = max(step[op.name] for op in order if op.layer == layer and phases[op.name] == "forward")
            assert all(phases[op.name] == "backward" for op in copies)
            assert min(step[op.name] for op in copies) > max(step[op.name] for op in order
                                                              if phases[op.name] == "forward")
            if mode == "full":  # the whole forward runs again
                assert {op.name.removeprefix(PREFIX) for op in copies} == {
                    op.name for op in order if op.layer == layer and phases[op.name] == "forward"}
            for op in copies:
                original = graph.op_by_name[op.name.removeprefix(PREFIX)]
                assert (op.kind, op.attrs) == (original.kind, original.attrs)
                for t in original.outputs:  # held no longer than the forward needs it
                    read_outside = any(reader.layer != layer for reader in graph.consumers.get(t, ()))
                    assert read_outside or ranges[t][1] <= last_forward < first_backward, t


def test_recomputation_trades_activation_memory_for_backward_compute(steps):
    hw = bind_hardware("dgx-h100", MESH)
    reports = {mode: estimate(replicated(graph), hw) for mode, graph in steps.items()}
    peaks = [reports[m].activation_peak_bytes for m in ("none", "selective", "full")]
    assert peaks[0] > peaks[1] > peaks[2]
    for mode in ("selective", "full"):
        copies = {op.name for op in recomputed_ops(steps[mode])}
        added = sum(entry["compute_s"] for entry in reports[mode].ops if entry["op"] in copies)
        kept = sum(entry["compute_s"] for entry in reports[mode].ops if entry["op"] not in copies)
        # the forward no longer writes what only its recomputation reads: fused, it costs less
        assert added > 0 and kept <= reports["none"].compute_s and reports[mode].compute_s == pytest.approx(kept + added)
    assert "layer0.mlp.fc1" in steps["full"].fused and "layer0.mlp.fc1" not in steps["none"].fused


def test_a_plan_with_recomputation_simulates_and_its_partitioned_ir_holds_the_copies(tmp_path):
    document, _ = planned(tmp_path, "plan", "--mesh", "dp=2,tp=2", "--recompute", "full", "--time-limit", "10",
                          "--verify", "always", "--emit", "partitioned")
    assert document["recompute"] == "full" and document["verification"]["status"] == "passed"
    copies = [name for name in document["ops"] if name.startswith(PREFIX)]
    assert copies and all(document["ops"][name]["option"] == document["ops"][name.removeprefix(PREFIX)]["option"]
                          for name in copies)
    ir = next((tmp_path / "out").glob("*partitioned*.mlir")).read_text()
    assert f"{PREFIX}layer1.attn.softmax" in ir
    # the plan reads back onto the graph rewritten as it says
    code, out, err = run_cli("estimate", str(tmp_path / "g.json"), "--plan", str(tmp_path / "out" / "plan.json"), "--mesh",
                             "dp=2,tp=2", "--json")
    assert code == 0, err
    assert any(entry["op"].startswith(PREFIX) for entry in json.loads(out)["ops"])


def test_recomputation_needs_a_training_step_with_layers_and_a_known_mode():
    forward = graph_from_json(gpt(GPTConfig(layers=1, hidden=16, heads=2, seq=8, batch=2, vocab=32)), MESH)
    with pytest.raises(InputError, match="no gradients"):
        with_recomputation(forward, "full")
    with pytest.raises(InputError, match="must be one of"):
        with_recomputation(forward, "some")
    assert with_recomputation(forward, "none") is forward


def test_auto_plans_each_recomputation_and_keeps_the_fastest(tmp_path):
    document, err = planned(tmp_path, "plan", "--mesh", "dp=2,tp=2", "--recompute", "auto", "--time-limit", "3",
                            "--memory-budget", "1.2MiB", "--verify", "always")
    steps = {line.split()[1].rstrip(":"): float(line.split()[3]) for line in err.splitlines()
             if line.startswith("  recompute ") and " step " in line}
    assert sorted(steps) == ["full", "none", "selective"]
    chosen = min(steps, key=steps.get)
    assert document.get("recompute", "none") == chosen
    assert document["solver"]["objective_s"] == pytest.approx(steps[chosen], rel=1e-5)
    assert document["verification"]["status"] == "passed"


def test_auto_skips_a_selective_recomputation_that_frees_nothing():
    fused = GPTConfig(layers=2, hidden=16, heads=2, seq=8, batch=2, vocab=32)  # attention is one fused op
    graph = graph_from_json(gpt(fused, training=True), MESH)
    assert with_recomputation(graph, "selective", MESH) is graph
    assert list(recomputations(graph, "auto", MESH)) == ["none", "full"]


def test_search_plans_every_candidate_on_the_recomputed_step(tmp_path):
    document, _ = planned(tmp_path, "search", "--devices", "2", "--topology", "dgx-h100", "--recompute", "full",
                          "--time-limit", "3", "--max-axes", "1")
    ranking = json.loads((tmp_path / "out" / "ranking.json").read_text())
    assert document["recompute"] == ranking["recompute"] == "full"
    assert f"{PREFIX}layer0.attn.softmax" in document["ops"]


def test_search_auto_searches_each_recomputation_and_keeps_the_fastest(tmp_path):
    document, err = planned(tmp_path, "search", "--devices", "2", "--topology", "dgx-h100", "--recompute", "auto",
                            "--time-limit", "3", "--max-axes", "1", "--memory-budget", "1.2MiB")
    ranking = json.loads((tmp_path / "out" / "ranking.json").read_text())
    section = ranking["recompute_searched"]
    steps = {row["recompute"]: row["step_s"] for row in section["modes"]}
    assert sorted(steps) == ["full", "none", "selective"]
    found = {mode: step for mode, step in steps.items() if step is not None}
    chosen = min(found, key=found.get)
    assert section["chosen"] == chosen == document.get("recompute", "none") == ranking.get("recompute", "none")
    assert document["totals"]["step_s"] == pytest.approx(found[chosen], rel=1e-6)
    assert section["certified_lower_bound_step_s"] == min(row["certified_lower_bound_step_s"] for row in section["modes"])
    assert section["certified_lower_bound_step_s"] <= found[chosen]
    assert (f"{PREFIX}layer0.attn.softmax" in document["ops"]) == (chosen != "none")


def test_a_mask_made_inside_the_layer_is_recomputed_with_the_core_and_names_already_taken_are_refused(steps):
    document = graph_to_json(steps["none"])
    for layer in range(CONFIG.layers):  # the causal bias cut to the sequence inside each layer, as nanoGPT does
        at = next(i for i, op in enumerate(document["ops"]) if op["name"] == f"layer{layer}.attn.masked")
        document["tensors"][f"layer{layer}.attn.bias_cut"] = {"shape": [S, S], "dtype": "bf16"}
        document["ops"].insert(at, {"name": f"layer{layer}.attn.bias_cut", "kind": "reshape",
                                    "inputs": ["causal_bias"], "outputs": [f"layer{layer}.attn.bias_cut"],
                                    "shape": [S, S], "layer": layer})
        document["ops"][at + 1]["inputs"][1] = f"layer{layer}.attn.bias_cut"
    selective = with_recomputation(graph_from_json(document, MESH), "selective", MESH)
    for layer in range(CONFIG.layers):
        names = {op.name for op in recomputed_ops(selective) if op.layer == layer}
        assert {f"{PREFIX}layer{layer}.attn.softmax", f"{PREFIX}layer{layer}.attn.bias_cut"} <= names
    with pytest.raises(InputError, match="recomputed before"):
        with_recomputation(selective, "full", MESH)
