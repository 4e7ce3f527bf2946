"""`autoshard search --pipeline auto`: stages, microbatches, schedule and the stage's mesh chosen
together, ranked by the simulated step beside the plain search (S = 1), with a certified bound."""

from __future__ import annotations

import json

import pytest

from autoshard.cli.main import main
from autoshard.models.gpt import GPTConfig, gpt
from autoshard.search.candidates import enumerate_candidates
from autoshard.search.pipelined import microbatch_counts, schedules, stage_counts
from autoshard.search.stage_tasks import bind_stages
from support.cli import mlp_graph

GPT = GPTConfig(layers=4, hidden=64, heads=4, seq=16, batch=8, vocab=256)


def gpt_file(folder, config: GPTConfig = GPT) -> str:
    path = folder / "gpt.json"
    path.write_text(json.dumps(gpt(config, training=True)))
    return str(path)


def search_args(graph: str, *extra: str) -> list[str]:
    return ["search", graph, "--devices", "8", "--topology", "dgx-h100", "--pipeline", "auto", "--max-axes", "1",
            "--jobs", "1", "--deterministic", "--verify", "never", *extra]


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """The 4-layer GPT step on 8 GPUs of one node (NVLink between every pair)."""
    folder = tmp_path_factory.mktemp("pipeline_search")
    assert main(search_args(gpt_file(folder), "-o", str(folder / "out"))) == 0
    return (json.loads((folder / "out" / "ranking.json").read_text()),
            json.loads((folder / "out" / "plan.json").read_text()))


def sizes(row: dict) -> tuple[int, ...]:
    return tuple(axis["size"] for axis in row["sub_mesh"]["axes"])


def test_every_stage_count_sub_mesh_microbatch_count_and_schedule_is_priced(searched):
    section = searched[0]["pipeline"]
    found = {(row["stages"], row["microbatches"], row["schedule"], row["virtual_stages_per_stage"], sizes(row))
             for row in section["configurations"]}
    assert stage_counts(8, 4) == [2, 4] and microbatch_counts(4, {8}) == [1, 4, 8]
    assert microbatch_counts(2, {8}, (2, 2)) == [1, 2, 4, 8] and microbatch_counts(4, {16}, (2,)) == [1, 4, 8, 16]
    expected = {(s, m, name, v, mesh) for s in (2, 4) for mesh in {sizes(row) for row in section["configurations"]
                                                                   if row["stages"] == s}
                for m in microbatch_counts(s, {GPT.batch}, mesh) for name, v in schedules(s, 4, m)}
    assert found == expected
    assert all(row["outcome"] == "priced" and row["sub_mesh"]["axes"][0]["size"] * row["stages"] == 8
               for row in section["configurations"])


def test_the_chosen_configuration_is_the_best_of_those_priced(searched):
    section = searched[0]["pipeline"]
    steps = [row["step_s"] for row in section["configurations"] if row["outcome"] == "priced"]
    assert steps == sorted(steps)
    assert section["chosen"]["step_s"] == min(steps + [section["plain_step_s"]])
    assert [row["rank"] for row in section["configurations"]] == list(range(1, len(steps) + 1))


def test_a_model_that_fits_on_a_fast_node_is_not_pipelined(searched):
    ranking, plan = searched
    section = ranking["pipeline"]
    assert section["chosen"]["stages"] == 1
    assert section["chosen"]["step_s"] == ranking["best"]["step_s"] < section["configurations"][0]["step_s"]
    assert "pipeline" not in plan


def test_the_certified_bound_is_under_every_priced_step_and_each_configurations_own(searched):
    section = searched[0]["pipeline"]
    bound = section["certified_lower_bound_step_s"]
    assert 0 < bound <= section["plain_step_s"]
    for row in section["configurations"]:
        assert bound <= row["lower_bound_step_s"] <= row["step_s"]


def test_the_stage_axis_is_outermost_across_nodes_and_the_sub_mesh_keeps_its_placement():
    eight, four = (enumerate_candidates("dgx-h100", n, max_axes=1).candidates[0] for n in (8, 4))
    two_nodes = bind_stages("dgx-h100", 16, 2, eight)
    assert two_nodes.mapping == {"pp": ["node"], "a0": ["gpu"]} and two_nodes.nodes == 2
    assert (two_nodes.hardware.axis_link_class("pp"), two_nodes.hardware.axis_link_class("a0")) == ("network", "nvlink")
    # 4 stages of 4 GPUs on 2 nodes: the stages take the nodes and the outer half of each node's GPUs
    assert bind_stages("dgx-h100", 16, 4, four).mapping == {"pp": ["node", "gpu"], "a0": ["gpu"]}


@pytest.mark.parametrize("extra, flag, said", [
    (["--pipeline", "1"], "--pipeline", "or a number of stages of at least 2, got '1'"),
    (["--pipeline", "yes"], "--pipeline", "got 'yes'"),
    (["--pipeline", "3"], "--pipeline", "3 stages do not fit: S must divide the 8 devices"),
    (["--pipeline", "8"], "--pipeline", "possible: [2, 4]"),
])
def test_bad_pipeline_flags_are_named(tmp_path, capsys, extra, flag, said):
    assert main(search_args(gpt_file(tmp_path), *extra)) == 2
    err = capsys.readouterr().err
    assert flag in err and said in err


def test_a_graph_without_layers_is_refused_before_the_search(tmp_path, capsys):
    assert main(search_args(mlp_graph(tmp_path))) == 2
    err = capsys.readouterr().err
    assert "--pipeline" in err and "declares no layers" in err


def test_a_memory_budget_no_plain_plan_fits_makes_a_pipeline_win(tmp_path):
    # Long sequences: activations dominate, and with microbatches in flight a stage holds a few of
    # them for its layers only. Budgeted solves take their time limit (not --deterministic's work
    # limit, far slower here): the outcome, S > 1, does not depend on how far each solve got.
    config = GPTConfig(layers=4, hidden=64, heads=4, seq=128, batch=8, vocab=256)
    args = search_args(gpt_file(tmp_path, config), "--memory-budget", "1MiB", "--time-limit", "2", "-o",
                       str(tmp_path / "out"))
    args.remove("--deterministic")
    assert main(args) == 0
    ranking = json.loads((tmp_path / "out" / "ranking.json").read_text())
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert ranking["best"] is None and ranking["counts"]["pruned"] == ranking["counts"]["candidates"]
    section = ranking["pipeline"]
    chosen = section["chosen"]
    assert chosen["stages"] > 1 and chosen["rank"] == 1
    assert chosen["step_s"] == min(row["step_s"] for row in section["configurations"] if row["outcome"] == "priced")
    assert plan["pipeline"]["stage_count"] == chosen["stages"]
    assert plan["pipeline"]["microbatches"] == chosen["microbatches"]
    assert all(stage["memory"]["peak_bytes"] <= 2 ** 20 for stage in plan["pipeline"]["stages"])
    assert 0 < section["certified_lower_bound_step_s"] <= chosen["step_s"]


def test_a_time_budget_spent_leaves_the_pipelined_configurations_unsolved(tmp_path):
    args = search_args(gpt_file(tmp_path), "--time-budget", "0.001", "-o", str(tmp_path / "out"))
    assert main(args) == 5
    section = json.loads((tmp_path / "out" / "ranking.json").read_text())["pipeline"]
    assert {row["outcome"] for row in section["configurations"]} == {"unsolved"}
    assert section["certified_lower_bound_step_s"] == 0 and section["chosen"]["step_s"] is None


def test_a_given_stage_count_is_the_only_one_searched(tmp_path):
    out = tmp_path / "out"
    assert main(search_args(gpt_file(tmp_path), "--pipeline", "4", "-o", str(out))) == 0
    rows = json.loads((out / "ranking.json").read_text())["pipeline"]["configurations"]
    assert rows and {row["stages"] for row in rows} == {4}
    assert {row["microbatches"] for row in rows} == set(microbatch_counts(4, {GPT.batch}, (2,)))


def test_a_routed_moes_token_groups_leave_the_per_replica_microbatch_counts():
    """A routed MoE declares its token groups as a second batch (12 samples of 8 groups each):
    the counts giving each replica one sample a microbatch are still offered."""
    assert microbatch_counts(2, {12, 96}, (3,)) == [1, 2, 4, 12]
    assert microbatch_counts(2, {12}, (3,)) == [1, 2, 4, 12]
