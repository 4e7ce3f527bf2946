"""`autoshard search --by-layer`: the configuration space searched from a three-layer sample, its
pruning sound (no pruned key has a configuration faster than the answer), its bound below every
step priced, and the winner planned whole as ranked."""

from __future__ import annotations

import dataclasses
import json
import math
import time

import pytest

from autoshard.cli.main import main
from autoshard.models import GPTConfig, gpt
from autoshard.models.training import training_precision
from autoshard.planning.layer_sample import layer_sample
from autoshard.planning.make_plan import SolveSettings
from autoshard.graph.schema import load_graph
from autoshard.search.compare import compared_key, parse_layout
from autoshard.search.layered import KeyOutcome, Queue, _keys, price_key, search_layered
from autoshard.search.pipelined import stage_counts
from autoshard.search.run import SearchOptions
from autoshard.search.sample_tasks import solve_sample_task
from autoshard.search.stage_tasks import bind_stages
from autoshard.search.tasks import SearchInputs
from support.cli import mlp_graph


def _model(layers: int, hidden: int, seq: int, batch: int) -> dict:
    config = GPTConfig(layers=layers, hidden=hidden, heads=8, seq=seq, batch=batch, vocab=256, style="megatron")
    with training_precision("bf16-mixed"):
        return gpt(config, training=True)


@pytest.fixture(scope="module")
def compute_bound():
    """A step wide enough that compute dominates on 4 GPUs, searched with and without full recomputation."""
    sample = layer_sample(_model(4, hidden=2048, seq=1024, batch=8))
    options = SearchOptions(devices=4, topology="dgx-a100", max_axes=1, jobs=1,
                            settings=SolveSettings(time_limit_s=5, workers=1, deterministic=True))
    return sample, options, search_layered(sample, options, ("none", "full"))


def test_no_key_has_a_configuration_under_its_bounds(compute_bound):
    """Pruning is sound when no configuration of a key is faster than the bound it is pruned by
    (the analytic one) or certified by (its formulation's): every key of this space is solved
    (those the search pruned here too) and every schedule simulated."""
    sample, options, found = compute_bound
    inputs = SearchInputs(sample.document, options.topology, options.settings)
    best_s = found.best.step_s
    for key in found.keys:
        assert key.outcome in ("solved", "pruned")
        answer = key.solved or solve_sample_task(inputs, key.task, options.settings.time_limit_s)
        placement = bind_stages(options.topology, options.devices, key.task.stages, key.task.candidate)
        priced = price_key(key, answer["prices"], sample, placement, None, math.inf)
        fastest = min(p.step_s for p in priced)
        assert fastest >= key.analytic_bound_s and fastest >= answer["bound_s"] / key.task.stages * (1 - 1e-9)
        if key.outcome == "pruned":
            assert key.analytic_bound_s >= best_s and fastest >= best_s


def test_bounds_hold_and_the_best_is_ranked_first(compute_bound):
    _, _, found = compute_bound
    steps = [p.step_s for p in found.priced if p.fits]
    assert found.best.step_s == min(steps) and found.priced[0] is found.best
    assert 0 < found.certified_bound_s <= min(steps)
    for priced in found.priced:
        if priced.fits:
            assert priced.bound_s <= priced.step_s * (1 + 1e-9)
    assert found.counts["keys"] == sum(found.counts[o] for o in ("solved", "pruned", "infeasible", "unsolved"))
    assert found.formulations >= found.counts["solved"]


def test_stage_counts_sub_meshes_and_schedules_are_all_priced(compute_bound):
    _, _, found = compute_bound
    solved = {(k.task.stages, k.task.microbatches, k.task.recompute) for k in found.keys if k.outcome == "solved"}
    assert {stages for stages, _, _ in solved} == {1, 2}
    schedules = {(p.configuration.task.stages, p.configuration.schedule_text) for p in found.priced}
    assert {("2", "1f1b"), ("2", "gpipe"), ("2", "zb-h1")} <= {(str(s), text) for s, text in schedules}


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("by_layer")
    graph = folder / "gpt.json"
    graph.write_text(json.dumps(_model(6, hidden=64, seq=16, batch=8)))
    code = main(["search", str(graph), "--devices", "4", "--topology", "dgx-a100", "--by-layer", "--pipeline", "2",
                 "--max-axes", "1", "--jobs", "1", "--deterministic", "--sample-time-limit", "5", "--time-limit", "10",
                 "--verify", "always", "--compare", "tp=2,pp=2,dp=1,interleave=1,micro=1,recompute=none",
                 "-o", str(folder / "out")])
    return code, json.loads((folder / "out" / "ranking.json").read_text()), \
        json.loads((folder / "out" / "plan.json").read_text())


def test_the_winner_is_planned_whole_as_ranked(cli_run):
    code, ranking, plan = cli_run
    assert code == 0
    chosen = ranking["by_layer"]["chosen"]
    assert chosen["rank"] == 1 and chosen["stages"] == 2
    assert plan["pipeline"]["stage_count"] == 2 and plan["pipeline"]["microbatches"] == chosen["microbatches"]
    assert plan["pipeline"]["schedule"] == chosen["schedule"]
    assert plan["pipeline"]["virtual_stages_per_stage"] == chosen["virtual_stages_per_stage"]
    assert [a["size"] for a in plan["mesh"]["axes"]][-1] == chosen["sub_mesh"]["axes"][-1]["size"]
    assert plan["search"]["ranked_step_s"] == chosen["step_s"]
    assert plan["verification"]["status"] == "passed"
    ranked = [row for row in ranking["by_layer"]["configurations"] if row["outcome"] == "priced"]
    assert [row["rank"] for row in ranked] == list(range(1, len(ranked) + 1))
    assert [row["step_s"] for row in ranked] == sorted(row["step_s"] for row in ranked)
    assert all(row["behind_previous"]["step_s"] >= 0 for row in ranked[1:])


def test_a_step_is_explained_term_by_term_and_the_compared_layout_ranked(cli_run):
    """Each configuration's step is its busiest stage's compute, communication, tails and waiting,
    which add up to it; the compared layout (Megatron's shardings pinned) is ranked among the
    searched ones and set against the chosen one term by term."""
    _, ranking, _ = cli_run
    section = ranking["by_layer"]
    for row in section["configurations"]:
        if row["outcome"] == "priced":
            terms = row["busiest_stage_s"]
            assert sum(terms.values()) == pytest.approx(row["step_s"], rel=1e-9)
            assert terms["compute_s"] > 0 and min(terms.values()) >= -1e-9 * row["step_s"]
    compared, chosen = section["compared"], section["chosen"]
    assert compared["stages"] == 2 and compared["outcome"] == "priced"
    faster = [r for r in section["configurations"] if r["outcome"] == "priced" and r["step_s"] < compared["step_s"]]
    assert compared["rank"] == 1 + len(faster)
    explained = compared["behind_chosen"]
    assert explained["step_s"] == pytest.approx(compared["step_s"] - chosen["step_s"])
    assert explained["step_s"] == pytest.approx(sum(v for k, v in explained.items() if k != "step_s"))


@pytest.mark.parametrize("argv,flag", [
    (["--rank-only"], "--rank-only"),
    (["--by-layer", "--pipeline", "5"], "--pipeline"),
])
def test_flags_a_user_gets_wrong_are_named(tmp_path, capsys, argv, flag):
    graph = tmp_path / "gpt.json"
    graph.write_text(json.dumps(_model(6, hidden=64, seq=16, batch=8)))
    assert main(["search", str(graph), "--devices", "4", "--topology", "dgx-a100", *argv]) == 2
    assert flag in capsys.readouterr().err


def test_a_graph_without_layers_is_refused_naming_by_layer(tmp_path, capsys):
    graph = mlp_graph(tmp_path)
    assert main(["search", graph, "--devices", "4", "--topology", "dgx-a100", "--by-layer"]) == 2
    assert "--by-layer" in capsys.readouterr().err


@pytest.fixture(scope="module")
def two_node_keys():
    """Every key of a 16-GPU (two DGX nodes) search of a batch-16 step, up to two axes."""
    sample = layer_sample(_model(4, hidden=64, seq=16, batch=16))
    options = SearchOptions(devices=16, topology="dgx-a100", max_axes=2, jobs=1)
    graph = load_graph(sample.document)
    counts = [1] + stage_counts(options.devices, len(sample.layers))
    return _keys(sample, options, ("none",), counts, graph)


def test_a_pairs_first_key_gives_each_replica_between_nodes_one_sample(two_node_keys):
    """The first key solved of a (stages, sub-mesh) pair splits the batch over the axes that
    cross nodes one sample a replica: M = batch / (their sizes' product)."""
    queue, first = Queue(two_node_keys), {}
    while queue:
        key = queue.pop()
        first.setdefault((key.task.stages, key.task.candidate), key)
    checked = 0
    for (stages, candidate), key in first.items():
        crossing = math.prod(size for (axis, dims), size in zip(candidate.mapping, candidate.axis_sizes)
                             if "node" in dims)
        if crossing > 1 and 16 // crossing >= stages:
            assert key.task.microbatches == 16 // crossing, (stages, candidate.label)
            checked += 1
    assert checked >= 3


def test_refining_pops_alternate_with_exploring_ones(two_node_keys):
    queue = Queue(two_node_keys)
    first = queue.pop()
    queue.learn(first, 1.0)
    pairs = [(k.task.stages, k.task.candidate) for k in (queue.pop(), queue.pop(), queue.pop(), queue.pop())]
    mine = (first.task.stages, first.task.candidate)
    assert [pair == mine for pair in pairs] == [True, False, True, False]
    assert len(set(pairs[1::2])) == 2  # each exploring pop a pair not tried before


class _StuckPool:
    """A pool whose one solve never ends: what a key too long for the time budget looks like."""

    slots = 1

    def __init__(self) -> None:
        self.submitted: list[object] = []
        self.cancelled: list[object] | None = None

    def submit(self, kind, task, time_limit_s, known=None):
        self.submitted.append(task)
        return len(self.submitted)

    def wait(self, handles, timeout_s):
        time.sleep(timeout_s)
        return []

    def close(self, cancel=None):
        self.cancelled = list(cancel or [])


def test_keys_running_when_the_budget_ends_are_stopped_and_left_unsolved(monkeypatch):
    pool = _StuckPool()
    monkeypatch.setattr("autoshard.search.layered.open_pool", lambda *args: pool)
    sample = layer_sample(_model(4, hidden=64, seq=16, batch=8))
    options = SearchOptions(devices=8, topology="dgx-a100", max_axes=1, jobs=1, time_budget_s=3.0,
                            settings=SolveSettings(time_limit_s=30, workers=1))
    found = search_layered(sample, options, ("none",))
    assert len(pool.submitted) == 1 and pool.cancelled == [1]  # the running solve stopped, no other sent
    stopped = [key for key in found.keys if key.reason == "the search's time budget ended while it was solved"]
    assert [key.task for key in stopped] == [dataclasses.replace(pool.submitted[0], beat_s=math.inf)]
    assert found.counts["solved"] == 0 and found.best is None
    assert {key.outcome for key in found.keys} <= {"unsolved", "infeasible"}
    assert found.certified_bound_s == min(key.analytic_bound_s for key in found.keys if key.outcome != "infeasible")


def test_a_keys_solves_start_from_megatrons_layout_and_are_never_slower_than_it():
    """A key of a Megatron-style step is solved from Megatron-LM's layout on its sub-mesh (tensor
    parallelism over the axes inside a node, the batch over those between nodes), which stays one of
    its plans: however short the solves, the key is never slower than that layout pinned."""
    sample = layer_sample(_model(4, hidden=256, seq=64, batch=8))
    layout = parse_layout("tp=8,pp=2,dp=2,interleave=1,micro=1,recompute=none")
    task, _, _, pinned = compared_key(layout, sample, "dgx-a100", 32, 8)
    assert dict(task.candidate.mapping) == {"dp": ("node",), "tp": ("gpu",)}
    # deterministic: the start and the pinned layout are the same solve, and reach the same plan
    inputs = SearchInputs(sample.document, "dgx-a100", SolveSettings(time_limit_s=0.5, workers=1, deterministic=True))
    free = solve_sample_task(inputs, task, 0.5)
    theirs = solve_sample_task(inputs, dataclasses.replace(task, graph_document=pinned), 0.5)
    placement = bind_stages("dgx-a100", 32, task.stages, task.candidate)

    def step_s(answer: dict, variants: list) -> float:
        key = KeyOutcome(task, 0.0, outcome="solved", bound_s=0.0, solved=answer)
        return price_key(key, variants, sample, placement, None, math.inf, only=("1f1b", 1))[0].step_s

    assert step_s(free, free["prices"]) <= step_s(theirs, theirs["prices"]) * (1 + 1e-9)
    assert step_s(free, free["prices"][-1:]) == pytest.approx(step_s(theirs, theirs["prices"][:1]), rel=1e-9)
    start = free["roles"][-1]
    assert "dense" in start["tp"]["tensor"] and "dense" in start["dp"]["data"]
    assert free["solver"]["formulations"] == 2 and free["solver"]["solves"] == len(free["prices"])
