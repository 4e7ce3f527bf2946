"""Recomputation chosen per layer (`plan --recompute auto --pipeline S`): the rewrite takes a mode
per layer, plan.json records it and reads back, the per-stage choice is the exact least-seconds
fit, and on a pipeline whose first stages hold more microbatches than its last the plan
recomputes there and keeps activations where they fit, faster than any one mode for all."""

from __future__ import annotations

import itertools
import json
import random

import pytest
from test_fuzz import run_cli

from autoshard.errors import InputError
from autoshard.graph.recompute import PREFIX, record_recompute, stated_recompute, with_recomputation
from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.models import GPTConfig, gpt
from autoshard.models.training import training_precision
from autoshard.pipeline import stage_orders
from autoshard.pipeline.schedules import chunk_inflight
from autoshard.planning.recompute_choice import PositionCosts, choose_modes

MESH = Mesh.of(tp=1)
CONFIG = GPTConfig(layers=8, hidden=64, heads=4, seq=32, batch=8, vocab=128, style="megatron")


@pytest.fixture(scope="module")
def step_document() -> dict:
    with training_precision("bf16-mixed"):
        return gpt(CONFIG, training=True)


def copies_by_layer(graph) -> dict[int, set[str]]:
    found: dict[int, set[str]] = {}
    for op in graph.ops:
        if op.name.startswith(PREFIX):
            found.setdefault(op.layer, set()).add(op.name[len(PREFIX):])
    return found


def test_a_mode_per_layer_rewrites_each_layer_as_its_own_mode_says(step_document):
    graph = graph_from_json(step_document, MESH)
    mixed = with_recomputation(graph, {0: "full", 3: "selective", 5: "none"}, MESH)
    full, selective = (copies_by_layer(with_recomputation(graph, mode, MESH)) for mode in ("full", "selective"))
    assert copies_by_layer(mixed) == {0: full[0], 3: selective[3]}
    assert selective[3] < full[3]  # the core only
    assert with_recomputation(graph, {layer: "none" for layer in range(8)}, MESH) is graph
    with pytest.raises(InputError) as error:
        with_recomputation(graph, {9: "full"}, MESH)
    assert "recompute" in str(error.value) and "[9]" in str(error.value)
    with pytest.raises(InputError) as error:
        with_recomputation(graph, {1: "some"}, MESH)
    assert "recompute[1]" in str(error.value) and "'some'" in str(error.value)


def test_plan_json_records_the_recomputed_layers_and_reads_them_back():
    document: dict = {}
    record_recompute(document, {4: "none", 0: "full", 2: "selective"})
    assert document["recompute"] == {"0": "full", "2": "selective"}
    assert stated_recompute(document) == {0: "full", 2: "selective"}
    record_recompute(document := {}, {1: "none"})
    assert "recompute" not in document
    with pytest.raises(InputError) as error:
        stated_recompute({"recompute": {"x": "full", "3": "most"}})
    assert "/recompute/x" in str(error.value) and "/recompute/3" in str(error.value)


def test_chunk_inflight_counts_what_one_f_one_b_and_interleaving_hold():
    assert chunk_inflight(stage_orders("1f1b", 4, 8))[:, 0].tolist() == [4, 3, 2, 1]
    interleaved = chunk_inflight(stage_orders("interleaved", 2, 4, 2))
    assert interleaved.shape == (2, 2) and (interleaved >= 1).all() and interleaved[0].sum() >= interleaved[1].sum()


def test_the_per_stage_choice_is_the_least_seconds_that_fits():
    """Against brute force over every mode per position, on random costs."""
    rng = random.Random(7)
    orders = stage_orders("1f1b", 2, 4)
    placed = [(0, 0), (0, 0), (0, 0), (1, 0), (1, 0)]
    for _ in range(40):
        costs = {mode: PositionCosts(tuple(rng.uniform(1, 3) + extra for _ in placed),
                                     tuple(rng.randint(0, 50) * keep for _ in placed),
                                     tuple(rng.randint(10, 20) for _ in placed))
                 for mode, extra, keep in (("none", 0.0, 4), ("selective", 0.3, 2), ("full", 1.0, 1))}
        budget = rng.uniform(150, 600)
        choice = choose_modes(list(costs.items()), orders, placed, budget)
        inflight = chunk_inflight(orders)[:, 0]
        for stage in (0, 1):
            positions = [p for p, (s, _) in enumerate(placed) if s == stage]
            fits = []
            for modes in itertools.product(costs, repeat=len(positions)):
                used = sum(costs[m].stored_bytes[p] + inflight[stage] * costs[m].saved_bytes[p]
                           for m, p in zip(modes, positions))
                if used <= budget:
                    fits.append(sum(costs[m].seconds[p] for m, p in zip(modes, positions)))
            if not fits:
                assert choice is None
                break
            assert choice is not None
            assert choice.stage_seconds[stage] == pytest.approx(min(fits))
            assert choice.stage_bytes[stage] <= budget
            assert choice.stage_seconds[stage] == pytest.approx(
                sum(costs[choice.modes[p]].seconds[p] for p in positions))


def test_auto_plans_a_mode_per_layer_beside_the_uniform_ones_and_keeps_the_fastest(tmp_path, step_document):
    """Budget between the stages' peaks without recomputation: the first stage (4 microbatches in
    flight) cannot keep everything, the last (1) can. Every uniform mode is planned, then the
    per-layer choice (on the uniform plans' prices, cut where it was fitted); the plan kept is the
    fastest of them all, within the budget on every stage, and simulated."""
    path = tmp_path / "g.json"
    path.write_text(json.dumps(step_document))
    code, out, err = run_cli("plan", str(path), "--mesh", "tp=2", "--topology", "dgx-h100", "--pipeline", "4",
                             "--microbatches", "8", "--recompute", "auto", "--memory-budget", "2.2MiB",
                             "--time-limit", "5", "--verify", "always", "-o", str(tmp_path / "out"))
    assert code == 0, err
    steps = {line.split(": step ")[0].split("recompute ")[1]: float(line.split(": step ")[1].split()[0])
             for line in err.splitlines() if line.startswith("  recompute ") and ": step " in line}
    planned = [line.split("recompute ")[1].split(": planning")[0] for line in err.splitlines()
               if line.startswith("  recompute ") and line.endswith(": planning")]
    assert planned[:3] == ["none", "selective", "full"] and "full" in steps
    said = [line for line in err.splitlines() if line.startswith("  recompute per layer: ")]
    if said:  # the choice is one of the uniform modes, planned already
        assert len(planned) == 3 and said[0].split(": ")[1].split()[0] in steps, said
    else:
        assert len(planned) == 4 and planned[3].startswith("per layer (") and planned[3] in steps, planned
    document = json.loads((tmp_path / "out" / "plan.json").read_text())
    pipeline = document["pipeline"]
    kept = min(steps, key=steps.get)
    assert pipeline["step_s"] == pytest.approx(steps[kept], rel=1e-5)  # said to 6 digits
    stated = stated_recompute(document)
    copied = {name.split(".")[1] for name in document["ops"] if name.startswith(PREFIX)}
    if kept.startswith("per layer"):
        assert isinstance(stated, dict) and 0 < len(stated) < CONFIG.layers
        assert copied == {f"layer{layer}" for layer in stated}
    else:
        assert stated == kept and copied == ({f"layer{layer}" for layer in range(CONFIG.layers)} if kept != "none"
                                             else set())
    budget = pipeline["memory_budget_bytes_per_device"]
    assert all(stage["memory"]["peak_bytes"] <= budget for stage in pipeline["stages"])
    assert document["verification"]["status"] == "passed"
