"""`autoshard emit`: IR of a given plan, verified by the real MLIR tools; a plan that does not fit
its graph is refused (exit 2, naming the op or tensor) and no IR is printed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoshard.cli import main
from autoshard.mesh import Mesh
from autoshard.mlir import emit_partitioned, verify
from autoshard.plan import plan_from_json
from autoshard.schema import load_graph
from autoshard.spmd import partition

MLP = str(Path(__file__).parent.parent / "examples" / "mlp.json")
MESH = "dp=2,tp=4"
# Megatron-style first layer: fc1 column-split over tp, fc2 row-split (its result partial over tp).
MEGATRON = {"mesh": {"axes": [{"name": "dp", "size": 2}, {"name": "tp", "size": 4}]},
            "ops": {"layer0.fc1": {"option": [["dp"], ["tp"], []]},
                    "layer0.act": {"option": [["dp"], ["tp"]]},
                    "layer0.fc2": {"option": [["dp"], [], ["tp"]]}},
            "tensors": {"x": [["dp"]], "layer0.w1": [[], ["tp"]], "layer0.w2": [["tp"]]}}


def write(tmp_path, document: dict) -> str:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(document))
    return str(path)


@pytest.mark.parametrize("dialect", ["mesh", "shard"])
def test_emitted_modules_pass_the_verifiers_and_are_the_library_text(tmp_path, capsys, dialect):
    plan_file = write(tmp_path, MEGATRON)
    assert main(["emit", MLP, "--plan", plan_file, "--stage", "partitioned", "--dialect", dialect]) == 0
    partitioned = capsys.readouterr().out
    mesh = Mesh.parse(MESH)
    plan = plan_from_json(MEGATRON, load_graph(MLP, mesh), mesh)
    assert partitioned == emit_partitioned(partition(plan), dialect=dialect)
    verify(partitioned, dialect)
    prefix = "mesh" if dialect == "mesh" else "shard"
    # the row-split fc2 leaves a partial sum that the unsplit layer1.fc1 must see reduced
    assert f"{prefix}.all_reduce" in partitioned or f"{prefix}.reduce_scatter" in partitioned
    assert main(["emit", MLP, "--plan", plan_file, "--dialect", dialect, "-o", str(tmp_path / "a.mlir")]) == 0
    annotated = (tmp_path / "a.mlir").read_text()
    verify(annotated, dialect)
    assert "annotate_for_users" in annotated


@pytest.mark.parametrize("change, where", [
    ({"ops": {"attention": {"option": [[]]}}}, "/ops/attention"),
    ({"tensors": {"h": [["dp"]]}}, "/tensors/h"),
    ({"tensors": {"layer0.fc1": [["tp"]]}}, "/tensors/layer0.fc1"),  # not what fc1's option produces
    ({"ops": {"layer0.fc1": {"option": [["dp"], ["tp"]]}}}, "layer0.fc1"),  # 2 loops of 3
    ({"ops": {"layer0.fc1": {"option": [["dp"], ["pp"], []]}}}, "layer0.fc1"),  # no such mesh axis
    ({"tensors": {"x": [["dp"], [], ["tp"]]}}, "/tensors/x"),  # rank 3 for a 2-D tensor
])
def test_a_plan_that_does_not_fit_the_graph_exits_2_naming_it_and_emits_nothing(tmp_path, capsys, change, where):
    document = json.loads(json.dumps(MEGATRON))
    for section, entries in change.items():
        document[section].update(entries)
    assert main(["emit", MLP, "--plan", write(tmp_path, document), "--stage", "partitioned"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and where in captured.err


@pytest.mark.parametrize("flag, value", [("--stage", "lowered"), ("--dialect", "tosa"), ("--arguments", "both")])
def test_bad_flags_exit_2_naming_the_flag(tmp_path, capsys, flag, value):
    assert main(["emit", MLP, "--plan", write(tmp_path, MEGATRON), flag, value]) == 2
    assert flag in capsys.readouterr().err
