"""`autoshard emit`: IR of a given plan, verified by the real MLIR tools; a plan that does not fit
its graph is refused (exit 2, naming the op or tensor) and no IR is printed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoshard.cli.main import main
from autoshard.graph.schema import load_graph
from autoshard.mesh import Mesh
from autoshard.mlir import emit_partitioned, verify
from autoshard.planning.plan import plan_from_json, plan_to_json
from autoshard.spmd.program import partition

MLP = str(Path(__file__).parent.parent / "examples" / "mlp.json")
MESH = "dp=2,tp=4"
# Megatron-style first layer: fc1 column-split over tp, fc2 row-split (its result partial over tp);
# written out as a whole `autoshard.plan/v1` document, as a plan file must be.
MEGATRON = plan_to_json(plan_from_json({"ops": {"layer0.fc1": {"option": [["dp"], ["tp"], []]},
                                                "layer0.act": {"option": [["dp"], ["tp"]]},
                                                "layer0.fc2": {"option": [["dp"], [], ["tp"]]}},
                                        "tensors": {"x": [["dp"]], "layer0.w1": [[], ["tp"]], "layer0.w2": [["tp"]]}},
                                       load_graph(MLP, Mesh.parse(MESH)), Mesh.parse(MESH)))


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
    ({"ops": {"layer0.fc1": {"kind": "matmul", "option": [["dp"], ["tp"]]}}}, "layer0.fc1"),  # 2 loops of 3
    ({"ops": {"layer0.fc1": {"kind": "matmul", "option": [["dp"], ["pp"], []]}}}, "layer0.fc1"),  # no such mesh axis
    ({"tensors": {"x": [["dp"], [], ["tp"]]}}, "/tensors/x"),  # rank 3 for a 2-D tensor
    ({"ops": {"layer0.fc1": [["dp"], ["tp"], []]}}, "/ops/layer0.fc1"),  # not an object
    ({"ops": {"layer0.fc1": {"opton": [["dp"], ["tp"], []]}}}, "/ops/layer0.fc1"),  # no option
])
def test_a_plan_that_does_not_fit_the_graph_exits_2_naming_it_and_emits_nothing(tmp_path, capsys, change, where):
    document = json.loads(json.dumps(MEGATRON))
    for section, entries in change.items():
        document[section].update(entries)
    assert main(["emit", MLP, "--plan", write(tmp_path, document), "--stage", "partitioned"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and where in captured.err


@pytest.mark.parametrize("section, value", [("ops", [["dp"]]), ("tensors", "x")])
def test_plan_sections_that_are_not_objects_are_named(tmp_path, capsys, section, value):
    document = json.loads(json.dumps(MEGATRON)) | {section: value}
    assert main(["emit", MLP, "--plan", write(tmp_path, document)]) == 2
    assert f"/{section}: expected an object" in capsys.readouterr().err


def test_offsets_spelling_out_the_even_split_are_the_same_layout(tmp_path, capsys):
    document = json.loads(json.dumps(MEGATRON))
    # fc1 produces [8, 256] split over tp on dim 1: 64 columns each
    document["tensors"]["layer0.fc1"] = {"split_axes": [["dp"], ["tp"]],
                                         "sharded_dims_offsets": [[0, 4, 8], [0, 64, 128, 192, 256]]}
    assert main(["emit", MLP, "--plan", write(tmp_path, document)]) == 0
    document["tensors"]["layer0.fc1"]["sharded_dims_offsets"][1] = [0, 32, 128, 192, 256]
    assert main(["emit", MLP, "--plan", write(tmp_path, document)]) == 2
    assert "/tensors/layer0.fc1: given as" in capsys.readouterr().err


def test_every_bad_flag_is_named_at_once(tmp_path, capsys):
    assert main(["emit", MLP, "--plan", write(tmp_path, MEGATRON), "--stage", "lowered", "--dialect", "tosa",
                 "--arguments", "both"]) == 2
    err = capsys.readouterr().err
    assert "3 problem(s)" in err and all(f"{flag}: " in err for flag in ("--stage", "--dialect", "--arguments"))


def test_an_output_that_cannot_be_written_is_named(tmp_path, capsys):
    assert main(["emit", MLP, "--plan", write(tmp_path, MEGATRON), "-o", str(tmp_path)]) == 2
    assert "-o: cannot write" in capsys.readouterr().err


@pytest.mark.parametrize("stage", ["annotated", "partitioned"])
@pytest.mark.parametrize("flags, named", [
    (["--topology", "nope"], "--topology: unknown profile 'nope'"),
    (["--topology", "dgx-h100", "--nodes", "0"], "--nodes: must be a positive integer"),
    (["--nodes", "0"], "--nodes: must be a positive integer"),
    (["--slice", "2x"], "--slice: expected a slice shape"),
])
def test_a_wrong_hardware_flag_is_named_at_every_stage(tmp_path, capsys, stage, flags, named):
    """The annotated stage prices nothing, yet a wrong hardware flag is refused, not ignored."""
    assert main(["emit", MLP, "--plan", write(tmp_path, MEGATRON), "--stage", stage, *flags]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and named in captured.err
    if flags[:2] == ["--topology", "nope"]:
        assert "dgx-h100" in captured.err and "tpu-v5p" in captured.err  # the known profiles


def test_a_known_topology_leaves_the_annotated_module_unchanged(tmp_path, capsys):
    plan_file = write(tmp_path, MEGATRON)
    assert main(["emit", MLP, "--plan", plan_file]) == 0
    plain = capsys.readouterr().out
    assert main(["emit", MLP, "--plan", plan_file, "--topology", "dgx-h100"]) == 0
    assert capsys.readouterr().out == plain
