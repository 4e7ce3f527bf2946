"""`autoshard reshard`: one resharding planned, priced, emitted as IR the real MLIR tools accept,
and run in the simulator; bad input names its flag and exits 2."""

from __future__ import annotations

import dataclasses
import json

import pytest

from autoshard.cli import reshard
from autoshard.cli.main import main
from autoshard.mesh import Mesh
from autoshard.mlir.toolchain import verify
from autoshard.planning.hardware import bind_hardware
from autoshard.resharding import bytes_moved_price, plan_resharding
from autoshard.sharding import Sharding
from autoshard.spmd.program import check_program, resharding_program

MESH = Mesh.of(x=2, y=3)
SEED = ["--mesh", "x=2,y=3", "--shape", "6x6", "--from", "[[x],[y]]", "--to", "[[y],[x]]"]
PARTIAL_X = '{"split_axes": [], "partial": {"kind": "sum", "axes": ["x"]}}'


def run_json(capsys, argv: list[str]) -> tuple[int, dict]:
    code = main(["reshard", *argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_the_seed_transpose_is_one_exchange_receiving_at_most_the_target_shard(capsys):
    code, out = run_json(capsys, [*SEED, "--verify"])
    assert code == 0
    kinds = [s["kind"] for s in out["steps"]]
    assert kinds and "all_gather" not in kinds  # not gather-everything-then-slice
    # The target shard is 2x3 f32 = 24 B; every device receives at most that.
    assert out["target_shard_bytes"] == 24
    assert 0 < out["max_bytes_received_per_device"] <= 24
    assert out["verify"]["passed"] and out["verify"]["first_divergence"] is None
    assert out["steps"][-1]["after"] == {"split_axes": [["y"], ["x"]]}


@pytest.mark.parametrize("dialect", ["mesh", "shard"])
def test_the_ir_takes_the_source_shard_returns_the_target_shard_and_verifies(capsys, dialect):
    code, out = run_json(capsys, [*SEED, "--dialect", dialect])
    assert code == 0 and out["dialect"] == dialect
    ir = out["ir"]
    assert "func.func @reshard(%x: tensor<3x2xf32>) -> tensor<2x3xf32>" in ir
    verify(ir, dialect)


def test_the_text_output_says_it_prices_by_bytes_moved_and_verifies(capsys):
    assert main(["reshard", *SEED, "--verify"]) == 0
    text = capsys.readouterr().out
    assert "priced by bytes moved (autoshard.resharding.bytes_moved_price" in text
    assert "no --topology was given" in text
    assert "1. permute over [x, y]" in text
    assert "at most 24 B received per device (the target shard is 24 B)" in text
    assert "verify: PASS" in text
    assert "func.func @reshard(" in text and "mesh.mesh @mesh(shape = 2x3)" in text


def test_a_partial_source_is_reduce_scattered_and_priced_by_bytes_moved(capsys):
    code, out = run_json(capsys, ["--mesh", "x=2,y=3", "--shape", "6x6", "--from", PARTIAL_X, "--to", "[[x]]",
                                  "--verify"])
    assert code == 0
    (step,) = out["steps"]
    assert step["kind"] == "reduce_scatter" and step["mesh_axes"] == ["x"]
    assert step["dims"] == {"reduction": "sum", "scatter_axis": 0}
    # Input buffer 6x6 f32 = 144 B; a ring reduce-scatter over 2 devices receives half of it.
    assert step["bytes_per_device"] == 144 and out["max_bytes_received_per_device"] == 72
    assert out["price"] == {"model": "bytes_moved", "bytes_per_s": 1e9}
    assert out["seconds"] == pytest.approx(72 / 1e9)
    assert out["source"] == {"split_axes": [], "partial": {"kind": "sum", "axes": ["x"]}}
    assert out["verify"]["passed"]
    for dialect in ("mesh", "shard"):
        code, out = run_json(capsys, ["--mesh", "x=2,y=3", "--shape", "6x6", "--from", PARTIAL_X, "--to", "[[x]]",
                                      "--dialect", dialect])
        assert "reduce_scatter" in out["ir"]
        verify(out["ir"], dialect)


def test_a_topology_prices_the_steps_with_its_collective_times(capsys):
    code, out = run_json(capsys, ["--mesh", "x=2,y=3", "--shape", "6x6", "--dtype", "bf16", "--from", PARTIAL_X,
                                  "--to", "[[x]]", "--topology", "dgx-h100"])
    assert code == 0
    assert out["price"]["model"] == "topology" and out["price"]["topology"] == "dgx-h100"
    expected = bind_hardware("dgx-h100", MESH).collective_seconds("reduce_scatter", ("x",), 6 * 6 * 2)
    assert out["seconds"] == pytest.approx(expected) and out["steps"][0]["bytes_per_device"] == 72
    assert main(["reshard", "--mesh", "x=2,y=3", "--shape", "6x6", "--from", PARTIAL_X, "--to", "[[x]]",
                 "--topology", "dgx-h100"]) == 0
    assert "priced on dgx-h100" in capsys.readouterr().out


def test_equal_layouts_need_no_steps(capsys):
    code, out = run_json(capsys, ["--mesh", "x=2,y=3", "--shape", "6x6", "--from", "[[x]]",
                                  "--to", '{"split_axes": [["x"]]}', "--verify"])
    assert code == 0 and out["steps"] == [] and out["seconds"] == 0 and out["max_bytes_received_per_device"] == 0
    assert "return %x : tensor<3x6xf32>" in out["ir"] and out["verify"]["passed"]


@pytest.mark.parametrize("source, kind", [("[]", "max"), ("[[x]]", "min")])
def test_a_max_or_min_partial_target_is_held_by_a_replicated_value(capsys, source, kind):
    """A value replicated over y is a valid max/min-partial value over y: no reduction to plan,
    and the verification accepts the target as held."""
    target = json.dumps({"split_axes": [], "partial": {"kind": kind, "axes": ["y"]}})
    code, document = run_json(capsys, ["--mesh", "x=2,y=3", "--shape", "6x6", "--from", source, "--to", target,
                                       "--verify"])
    assert code == 0 and document["verify"]["passed"] is True
    assert all(step["kind"] != "all_reduce" for step in document["steps"])


def test_a_wrong_step_fails_naming_the_step_and_device_with_exit_1(capsys, monkeypatch):
    planned = reshard.plan_resharding

    def over_the_wrong_axis(*args, **kwargs):
        resharding = planned(*args, **kwargs)
        (step,) = resharding.steps
        assert step.kind == "all_slice" and step.mesh_axes == ("y",)
        return dataclasses.replace(resharding, steps=(dataclasses.replace(step, mesh_axes=("x",)),))

    monkeypatch.setattr(reshard, "plan_resharding", over_the_wrong_axis)
    argv = ["--mesh", "x=2,y=3", "--shape", "5x7", "--from", "[]", "--to", "[[y]]", "--verify"]
    assert main(["reshard", *argv]) == 1
    line = next(l for l in capsys.readouterr().out.splitlines() if l.startswith("verify:"))
    assert line.startswith("verify: FAIL at op \"step 1: all_slice over ['x']\" device [0, 0]: ")
    assert "holds shape [3, 7]; sharding [[y]] of [5, 7] gives [2, 7]" in line
    code, out = run_json(capsys, argv)
    assert code == 1 and not out["verify"]["passed"]
    assert out["verify"]["first_divergence"]["device"] == [0, 0]


@pytest.mark.parametrize("change, flag, expected", [
    ({"--from": "[[z],[y]]"}, "--from", "unknown mesh axis 'z'"),
    ({"--shape": "6"}, "--from", "the tensor has rank 1"),
    ({"--to": "[[y],[x],[x]]"}, "--to", "used twice"),
    ({"--shape": "6x"}, "--shape", "expected positive sizes joined by x"),
    ({"--shape": "6x0"}, "--shape", "expected positive sizes joined by x"),
    ({"--dtype": "f17"}, "--dtype", "expected one of ['f64', 'f32'"),
    ({"--topology": "dgx-h900"}, "--topology", "unknown profile 'dgx-h900'"),
    ({"--topology": "dgx-h100", "--nodes": "4"}, "--nodes", "do not split evenly over 4 nodes"),
    ({"--nodes": "2"}, "--nodes", "only applies with --topology"),
    ({"--from": "[[x],[y]"}, "--from", "cannot read sharding"),
    ({"--to": '{"split_axes": [["y"]], "partial": {"kind": "avg", "axes": ["x"]}}'}, "--to partial/kind",
     "partial kind must be one of"),
    ({"--to": '{"split_axes": [["y"]], "sharded_dims_offsets": 3}'}, "--to sharded_dims_offsets",
     "a list of integer lists"),
    ({"--to": '{"split_axes": [["y"]], "partial": {"kind": "sum", "axes": ["x"]}}'}, "--to",
     "resharding can only reduce partial values"),
    ({"--mesh": "x=2,y"}, "--mesh", "expected NAME=SIZE"),
    ({"--mesh": "x=2,y=0"}, "--mesh y", "positive integer"),
    ({"--shape": "4096x4096", "--mesh": "x=8,y=8", "--from": "[[x]]", "--to": "[]", "--verify": None}, "--verify",
     "over the 2 GiB limit"),
])
def test_bad_input_names_its_flag_and_exits_2(capsys, change, flag, expected):
    options = dict(zip(SEED[::2], SEED[1::2])) | change
    argv = [item for key, value in options.items() for item in ((key,) if value is None else (key, value))]
    assert main(["reshard", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    assert f"  {flag}: " in captured.err and expected in captured.err


def test_every_input_problem_is_reported_at_once(capsys):
    assert main(["reshard", "--mesh", "x=2,y=3", "--shape", "6x6", "--dtype", "q", "--from", "[[w]]",
                 "--to", "[[v]]"]) == 2
    err = capsys.readouterr().err
    assert "3 problem(s)" in err and "--dtype: " in err and "--from: " in err and "--to: " in err


def test_the_program_of_one_resharding_is_the_steps_between_source_and_target():
    source, target = Sharding.parse(PARTIAL_X), Sharding.parse("[[], [x, y]]")
    resharding = plan_resharding(MESH, (6, 6), 4, source, target, bytes_moved_price(MESH))
    program = resharding_program(MESH, resharding, "f32", bytes_moved_price(MESH))
    check_program(program)
    (argument,), (result,) = program.arguments, program.results
    assert argument.sharding == source and result.sharding == target
    assert [c.step for c in program.communicates()] == list(resharding.steps) and len(resharding.steps) >= 2
    assert program.communication_seconds() == resharding.seconds
