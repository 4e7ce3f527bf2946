"""`autoshard plan`: the plan file, the IR beside it (verified by the real MLIR tools), the
simulator's verdict on the plan, and errors naming the flag."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from autoshard.cli import plan as plan_command
from autoshard.cli.main import main
from autoshard.delivery import deliver as deliver_module
from autoshard.mlir import verify
from autoshard.sim import verify as verification
from autoshard.spmd.program import LocalOp
from support.cli import mlp_graph, plan_args


@pytest.mark.parametrize("dialect", ["mesh", "shard"])
def test_plan_writes_verified_ir_and_a_simulated_verdict(tmp_path, capsys, dialect):
    assert main(plan_args(tmp_path, "--emit", "annotated,partitioned", "--dialect", dialect)) == 0
    out = tmp_path / "out"
    document = json.loads((out / "plan.json").read_text())
    # the budget forces the weights apart and the pin makes a collective: three ops and at least
    # one collective are simulated and checked
    storage = {name: entry["split_axes"] for name, entry in document["tensors"].items() if name in ("w1", "w2")}
    assert any(axes != [] for axes in storage.values()), storage
    assert document["totals"]["peak_memory_bytes_per_device"] <= 1.5 * 2 ** 20
    assert document["verification"]["status"] == "passed" and document["verification"]["values_checked"] >= 4
    annotated, partitioned = (out / "annotated.mlir").read_text(), (out / "partitioned.mlir").read_text()
    verify(annotated, dialect)
    verify(partitioned, dialect)
    prefix = "mesh" if dialect == "mesh" else "shard"
    assert f"{prefix}.shard" in annotated and "linalg.matmul" in annotated
    assert any(f"{prefix}.{kind}" in partitioned for kind in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"))
    printed = capsys.readouterr().out
    assert "simulator: PASS" in printed and "partitioned.mlir" in printed


def test_a_wrong_program_fails_verification_with_exit_1_naming_the_op(tmp_path, capsys, monkeypatch):
    real_partition = deliver_module.partition

    def relu_for_gelu(plan, price):
        """The program with the activation computing relu where the graph says gelu."""
        program = real_partition(plan, price)
        body = tuple(dataclasses.replace(i, op=dataclasses.replace(i.op, kind="relu"))
                     if isinstance(i, LocalOp) and i.op.name == "act" else i for i in program.body)
        return dataclasses.replace(program, body=body)

    monkeypatch.setattr(deliver_module, "partition", relu_for_gelu)
    assert main(plan_args(tmp_path)) == 1
    verification = json.loads((tmp_path / "out" / "plan.json").read_text())["verification"]
    assert verification["status"] == "failed" and verification["first_divergence"]["op"] == "act"
    assert "simulator: FAIL at op 'act'" in capsys.readouterr().out


def test_verification_can_be_switched_off(tmp_path, capsys):
    assert main(plan_args(tmp_path, "--verify", "never")) == 0
    assert json.loads((tmp_path / "out" / "plan.json").read_text())["verification"]["status"] == "skipped"
    assert "simulator: not run (verification not requested)" in capsys.readouterr().out


def test_verification_is_skipped_with_the_reason_over_its_memory_limit(tmp_path, capsys, monkeypatch):
    """`auto` simulates up to AUTO_LIMIT_BYTES; a plan needing more is skipped, saying how much it
    needs, while `always` runs it (up to its own limit)."""
    monkeypatch.setattr(verification, "AUTO_LIMIT_BYTES", 1000)
    assert main(plan_args(tmp_path)) == 0
    document = json.loads((tmp_path / "out" / "plan.json").read_text())["verification"]
    assert document["status"] == "skipped" and document["needs_bytes"] > 1000
    assert "over the 1000 B that verification 'auto' allows" in capsys.readouterr().out
    assert main(plan_args(tmp_path, "--verify", "always")) == 0
    assert json.loads((tmp_path / "out" / "plan.json").read_text())["verification"]["status"] == "passed"


@pytest.mark.parametrize("flags, where, words", [
    (["--emit", "lowered"], "--emit", "annotated or partitioned"),
    (["--dialect", "tosa"], "--dialect", "mesh or shard"),
    (["--arguments", "sharded"], "--arguments", "local or global"),
    (["--verify", "sometimes"], "--verify", "auto, always, never"),
    (["--seed", "-1"], "--seed", "must be in [0, 2**63 - 1]"),
    (["--workers", "0"], "--workers", "at least 1"),
    (["--time-limit", "nan"], "--time-limit", "positive number"),
    (["--weights", "time=nan"], "--weights", "finite number >= 0"),
    (["--weights", "time=-1"], "--weights", "finite number >= 0"),
    (["--weights", "speed=1"], "--weights", "unknown weight 'speed'"),
    (["--memory-budget", "lots"], "--memory-budget", "a size like 40GiB"),
    (["--topology", "nope"], "--topology", "unknown profile 'nope'"),
    (["--mesh", "tp=0"], "--mesh tp", "positive integer"),
    (["--nodes", "3"], "--nodes", "do not split evenly over 3 nodes"),
])
def test_bad_flags_exit_2_naming_the_flag(tmp_path, capsys, flags, where, words):
    assert main(plan_args(tmp_path, *flags)) == 2
    err = capsys.readouterr().err
    assert f"{where}: " in err and words in err and "Traceback" not in err


def test_every_bad_flag_is_reported_at_once_before_solving(tmp_path, capsys):
    occupied = tmp_path / "a_file"
    occupied.write_text("")
    assert main(["plan", mlp_graph(tmp_path), "--mesh", "tp=4", "--seed", "-2", "--dialect", "x",
                 "--emit", "annotated,bogus", "--verify", "no", "--time-limit", "0"]) == 2
    err = capsys.readouterr().err
    for flag in ("--seed", "--dialect", "--emit", "--verify", "--time-limit"):
        assert f"{flag}: " in err, flag
    assert "6 problem(s)" in err  # --emit twice: the unknown stage, and IR without -o
    assert main(["plan", mlp_graph(tmp_path), "--mesh", "tp=4", "-o", str(occupied / "out")]) == 2
    assert "-o: cannot create the output directory" in capsys.readouterr().err


def test_emitting_ir_needs_an_output_directory(tmp_path, capsys):
    assert main(["plan", mlp_graph(tmp_path), "--mesh", "tp=4", "--emit", "annotated"]) == 2
    assert "-o DIR" in capsys.readouterr().err


def two_partial_sums(path) -> str:
    """y = x1 @ w1 + x2 @ w2 with both contractions pinned split over tp: each product is a partial
    sum, and the add is linear in them, so one all_reduce of the sum can replace two."""
    doc = {"format": "autoshard.graph/v1", "name": "two_partials",
           "tensors": {"x1": {"shape": [16, 1024], "dtype": "f32", "role": "input"},
                       "x2": {"shape": [16, 1024], "dtype": "f32", "role": "input"},
                       "w1": {"shape": [1024, 16], "dtype": "f32", "role": "parameter"},
                       "w2": {"shape": [1024, 16], "dtype": "f32", "role": "parameter"},
                       "p1": {"shape": [16, 16], "dtype": "f32"}, "p2": {"shape": [16, 16], "dtype": "f32"},
                       "y": {"shape": [16, 16], "dtype": "f32"}},
           "ops": [{"name": "mm1", "kind": "matmul", "inputs": ["x1", "w1"], "outputs": ["p1"]},
                   {"name": "mm2", "kind": "matmul", "inputs": ["x2", "w2"], "outputs": ["p2"]},
                   {"name": "sum", "kind": "add", "inputs": ["p1", "p2"], "outputs": ["y"]}],
           "outputs": ["y"],
           "constraints": [{"tensor": t, "split_axes": axes, "required": True} for t, axes in
                           [("x1", [[], ["tp"]]), ("x2", [[], ["tp"]]), ("w1", [["tp"]]), ("w2", [["tp"]]), ("y", [])]]}
    file = path / "two_partials.json"
    file.write_text(json.dumps(doc))
    return str(file)


def test_collective_optimisations_apply_to_the_partitioned_program_and_are_simulated(tmp_path, capsys):
    args = ["plan", two_partial_sums(tmp_path), "--mesh", "tp=4", "--topology", "dgx-h100", "--time-limit", "5",
            "--emit", "partitioned", "--dialect", "shard"]
    assert main([*args, "-o", str(tmp_path / "opt")]) == 0
    document = json.loads((tmp_path / "opt" / "plan.json").read_text())
    optimized = document["collective_optimizations"]
    assert [c["rewrite"] for c in optimized["changes"]] == ["reassociate_all_reduce"]
    assert optimized["communication_s_after"] == pytest.approx(optimized["communication_s_before"] / 2)
    assert document["verification"]["status"] == "passed"
    assert (tmp_path / "opt" / "partitioned.mlir").read_text().count("shard.all_reduce") == 1
    assert "collective optimisations: 1 rewrite(s)" in capsys.readouterr().out
    # `emit` and `simulate` on the written plan rebuild the same program
    graph, plan_file = two_partial_sums(tmp_path), str(tmp_path / "opt" / "plan.json")
    assert main(["emit", graph, "--plan", plan_file, "--stage", "partitioned", "--dialect", "shard"]) == 0
    assert capsys.readouterr().out == (tmp_path / "opt" / "partitioned.mlir").read_text()
    assert main(["simulate", graph, "--plan", plan_file, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["values_checked"] == document["verification"]["values_checked"]

    assert main([*args, "--no-collective-opt", "-o", str(tmp_path / "planned")]) == 0
    assert "collective_optimizations" not in json.loads((tmp_path / "planned" / "plan.json").read_text())
    assert (tmp_path / "planned" / "partitioned.mlir").read_text().count("shard.all_reduce") == 2


def test_the_placement_is_recorded_and_emit_prices_on_it(tmp_path, capsys):
    """Two DGX nodes: dp crosses InfiniBand. `emit` rebuilds the program on the same placement
    from plan.json, so its IR is the one `plan` wrote."""
    out = tmp_path / "two_nodes"
    assert main(["plan", mlp_graph(tmp_path), "--mesh", "dp=2,tp=8", "--topology", "dgx-h100", "--nodes", "2",
                 "--memory-budget", "1.5MiB", "--time-limit", "5", "--emit", "partitioned", "-o", str(out)]) == 0
    document = json.loads((out / "plan.json").read_text())
    assert document["topology"] == "dgx-h100" and document["topology_options"] == {"nodes": 2}
    capsys.readouterr()
    assert main(["emit", str(tmp_path / "mlp.json"), "--plan", str(out / "plan.json"), "--stage", "partitioned"]) == 0
    assert capsys.readouterr().out == (out / "partitioned.mlir").read_text()


def test_the_progress_line_shows_no_incumbent_while_no_plan_fits_in_memory(capsys, monkeypatch):
    clock = iter([0.0, 2.0, 4.0])
    monkeypatch.setattr(plan_command.time, "perf_counter", lambda: next(clock))
    line = plan_command.ProgressLine()
    line("relax", math.inf, 7.2e14, 1.9)  # the bound alone says a fitting plan needs 720 s or more
    line("improve", 2.5e12, 2.4e12, 3.9)
    first, found, second = capsys.readouterr().err.splitlines()
    assert "no plan within memory yet" in first and "bound 720 s" in first and "gap" not in first
    assert found == "  solving: first plan within memory after 3.90 s of solving"
    assert "incumbent 2.5 s" in second and "gap 4.00%" in second
