"""MLIR emission: every module the tests emit is parsed and verified by the real tools
(`mlir-opt-22` for the `shard` spelling, `mlir-opt-19` for the `mesh` spelling after folding its
sharding ops into LLVM 19's attribute), the two spellings differ only by the dialect table, and a
handful of modules are kept as golden files (`AUTOSHARD_UPDATE_GOLDEN=1` rewrites them)."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from types import MappingProxyType

import pytest

from autoshard.errors import InputError
from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.mlir import MESH, SHARD, emit_annotated, emit_partitioned, to_llvm19, verify
from autoshard.mlir.dialect import PARTIAL_NOTE
from autoshard.mlir.toolchain import verify_all
from autoshard.planning.options import ShardingOption
from autoshard.planning.plan import Plan
from autoshard.resharding import CollectiveStep, Transfer
from autoshard.sharding import Sharding
from autoshard.spmd.collective_opt import optimize
from autoshard.spmd.program import Communicate, LocalOp, SpmdProgram, partition
from support.graphs import (
    MESHES,
    ZOO,
    cycled_plans,
    graph_doc,
    megatron,
    mlp2d,  # noqa: F401
)

O, S = ShardingOption, Sharding
GOLDEN = Path(__file__).parent / "golden"


def zoo_plans(count: int = 3) -> list[Plan]:
    plans = []
    for text in MESHES:
        mesh = Mesh.parse(text)
        for doc in ZOO.values():
            plans += cycled_plans(graph_from_json(doc, mesh), mesh, count)
    return plans


def test_every_zoo_module_passes_the_real_verifiers_in_both_spellings():
    plans = zoo_plans()
    programs = [partition(plan) for plan in plans]
    for dialect in ("mesh", "shard"):
        modules = [emit_annotated(plan, dialect) for plan in plans]
        modules += [emit_partitioned(program, dialect, arguments) for program in programs
                    for arguments in ("local", "global")]
        verify_all(modules, dialect)


def test_optimized_programs_pass_the_verifiers():
    modules = [emit_partitioned(optimize(partition(plan))[0], "shard") for plan in zoo_plans(2)]
    verify_all(modules, "shard")


def to_mesh_words(text: str) -> str:
    """The `shard` spelling with every word of the dialect table replaced by the `mesh` one."""
    for field in ("mesh_op", "sharding_op", "sharding_type", "shard_op", "axes_attr"):
        text = text.replace(getattr(SHARD, field), getattr(MESH, field))
    text = text.replace(f"{SHARD.prefix}.", f"{MESH.prefix}.").replace("(shard dialect)", "(mesh dialect)")
    return re.sub(r"reduction = (\w+)", lambda m: "reduction = " + MESH.reduction(m.group(1)), text)


def test_the_mesh_spelling_is_the_shard_module_with_the_reference_names():
    compared = 0
    for plan in zoo_plans(2):
        program = partition(plan)
        assert to_mesh_words(emit_partitioned(program, "shard")) == emit_partitioned(program, "mesh")
        if not any(plan.produced(t).is_partial for t in plan.graph.tensors):  # partial values are spelled apart
            assert to_mesh_words(emit_annotated(plan, "shard")) == emit_annotated(plan, "mesh")
            compared += 1
    assert compared > 20


def test_partial_values_in_each_spelling():
    plan = megatron()
    mesh_text = emit_annotated(plan, "mesh")
    assert "%sharding_4 = mesh.sharding @mesh split_axes = [[0]] partial = sum[1] : !mesh.sharding" in mesh_text
    assert "%y_sharded = mesh.shard %y to %sharding_4 : tensor<8x16xf32>" in mesh_text
    assert "%y_for_return = mesh.shard %y_sharded to %sharding annotate_for_users : tensor<8x16xf32>" in mesh_text
    llvm19 = to_llvm19(mesh_text)
    assert "mesh.shard %y to <@mesh, [[0]], partial = sum[1]> : tensor<8x16xf32>" in llvm19
    assert "mesh.sharding" not in llvm19
    verify(mesh_text, "mesh")
    shard_text = emit_annotated(plan, "shard")
    assert ("%y_sharded = shard.shard %y to %sharding {autoshard.partial_axes = array<i16: 1>, "
            "autoshard.partial_type = #shard<partial sum>} : tensor<8x16xf32>") in shard_text
    assert f"// {PARTIAL_NOTE}" in shard_text and "partial = " not in shard_text
    verify(shard_text, "shard")


def test_max_partial_and_rank_zero_values():
    mesh = Mesh.of(x=2, y=2)
    graph = graph_from_json(ZOO["reduction"], mesh)
    plan = Plan(graph, mesh, {"rowsum": O(((), ("x",))), "rowmax": O(((), ("x", "y"))),
                              "colmean": O(((), ())), "all": O((("y",),))}, {"x": S()})
    text = emit_annotated(plan, "mesh")
    assert "split_axes = [[]] partial = max[0, 1]" in text
    assert "split_axes = [[]] partial = sum[1] : !mesh.sharding" in text  # total: rank 0, partial over y
    assert "tensor<f32>" in text
    verify(text, "mesh")
    partitioned = emit_partitioned(plan, "mesh")
    assert "mesh.all_reduce %m on @mesh mesh_axes = [0, 1] reduction = <max> : tensor<8xf32> -> tensor<8xf32>" in partitioned
    verify(partitioned, "mesh")


def test_every_op_is_a_real_mlir_op_with_a_comment_naming_its_graph_op():
    mesh = Mesh.of(x=2)
    expected = {"mlp": ["linalg.matmul", "math.tanh"], "chain": ["arith.truncf", "math.absi", "math.exp"],
                "transpose": ["linalg.transpose"], "reshape": ["tensor.collapse_shape", "tensor.expand_shape"],
                "softmax": ["linalg.softmax dimension(1)"], "norms": ["math.sqrt"],
                "attention": ["linalg.softmax dimension(3)", "arith.cmpi ule"],
                "conv": ["tensor.pad", "linalg.conv_2d_nhwc_hwcf", "strides = dense<[2, 2]>"],
                "embedding": ["arith.index_cast", "linalg.index 3"],
                "routing": ["arith.cmpf ogt", "arith.extui", "linalg.index 2"],
                "structural": ["tensor.concat dim(1)", "tensor.extract_slice %c_sharded[0, 1] [4, 3] [1, 2]"],
                "contractions": ["linalg.batch_matmul", '"reduction"']}
    for name, doc in ZOO.items():
        graph = graph_from_json(doc, mesh)
        plan = cycled_plans(graph, mesh, 1)[0]
        text = emit_annotated(plan, "shard")
        for op in graph.ops:
            assert f"// op {op.name} ({op.kind}), option " in text
        for word in expected.get(name, []):
            assert word in text, (name, word)
        assert "linalg.generic" in text or name in ("transpose", "reshape", "softmax", "conv", "structural")


def test_partitioned_megatron_mlp_in_both_argument_conventions():
    plan = megatron()
    local = emit_partitioned(plan, "shard")
    assert "func.func @mlp(%x: tensor<4x16xf32>, %w1: tensor<16x8xf32>, %w2: tensor<8x16xf32>) -> tensor<4x16xf32>" in local
    assert "%y_1 = shard.all_reduce %y on @mesh grid_axes = [1] reduction = sum : tensor<4x16xf32> -> tensor<4x16xf32>" in local
    assert local.count("shard.all_") == 1
    full = emit_partitioned(plan, "mesh", "global")
    assert "func.func @mlp(%x: tensor<8x16xf32>, %w1: tensor<16x32xf32>, %w2: tensor<32x16xf32>)" in full
    assert "%w1_local = mesh.all_slice %w1 on @mesh mesh_axes = [1] slice_axis = 1 : tensor<16x32xf32> -> tensor<16x8xf32>" in full
    verify(local, "shard")
    verify(full, "mesh")


def test_uneven_shards_are_dynamic_dims_sized_from_the_process_index():
    mesh = Mesh.of(x=3)
    graph = graph_from_json(graph_doc("uneven", {"a": ((8, 4), "f32", "input"), "b": ((8, 4), "f32")},
                                      [("n", "neg", ["a"], ["b"], {})]), mesh)
    # 8 rows over 3 devices: 3, 3, 2 -> the row dim is dynamic, its size from the device's piece
    stored_whole = emit_partitioned(Plan(graph, mesh, {"n": O((("x",), ()))}, {"a": S()}), "shard")
    assert "%start = arith.muli %device, %c3 : index" in stored_whole
    assert "%size = arith.subi %stop_1, %start_1 : index" in stored_whole
    # the verifier wants statically cut dims to divide evenly: the cut dim is made dynamic first
    assert "%uneven = tensor.cast %a : tensor<8x4xf32> to tensor<?x4xf32>" in stored_whole
    assert "shard.all_slice %uneven on @mesh grid_axes = [0] slice_axis = 0 : tensor<?x4xf32> -> tensor<?x4xf32>" in stored_whole
    assert "%empty = tensor.empty(%size) : tensor<?x4xf32>" in stored_whole
    verify(stored_whole, "shard")
    # a full argument stored split is cut at the device's start
    stored_split = emit_partitioned(Plan(graph, mesh, {"n": O((("x",), ()))}, {"a": S((("x",),))}), "mesh", "global")
    assert "tensor.extract_slice %a[%start_1, 0] [%size, 4] [1, 1] : tensor<8x4xf32> to tensor<?x4xf32>" in stored_split
    verify(stored_split, "mesh")


def test_a_general_permutation_is_send_recv_rounds_from_a_device_table():
    mesh = Mesh.of(x=2, y=2)
    graph = graph_from_json(graph_doc("swap", {"a": ((4, 4), "f32", "input"), "b": ((4, 4), "f32")},
                                      [("n", "neg", ["a"], ["b"], {})]), mesh)
    plan = Plan(graph, mesh, {"n": O((("y",), ("x",)))}, {"a": S((("x",), ("y",)))})
    program = partition(plan)
    (move,) = program.communicates()
    assert move.step.kind == "permute"
    text = emit_partitioned(program, "mesh")
    # devices (0, 1) and (1, 0) swap buffers in one round; (0, 0) and (1, 1) keep theirs
    assert text.count("mesh.send") == 1 and text.count("mesh.recv") == 1
    assert ("arith.constant dense<[[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], [1, 0, 0, 0, 2, 2, 1, 0, 0, 0, 2, 2], "
            "[0, 1, 0, 0, 2, 2, 0, 1, 0, 0, 2, 2], [1, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0]]> : tensor<4x12xindex>") in text
    verify(text, "mesh")
    verify(emit_partitioned(program, "shard"), "shard")


def test_a_rotation_of_whole_buffers_is_a_shift():
    mesh = Mesh.of(x=4)
    graph = graph_from_json(graph_doc("rot", {"a": ((8,), "f32", "input"), "b": ((8,), "f32")},
                                      [("n", "neg", ["a"], ["b"], {})]), mesh)
    program = partition(Plan(graph, mesh, {"n": O((("x",),))}, {"a": S((("x",),))}))
    arg, op = program.arguments[0], program.body[0]
    # every device receives the whole buffer of the device one place before it along x
    transfers = tuple(Transfer(((d + 3) % 4,), (d,), ((0, 2),), ((0, 2),)) for d in range(4))
    step = CollectiveStep("permute", ("x",), MappingProxyType({"transfers": transfers}), (2,), (2,), 8.0, 8e-9,
                          arg.sharding, arg.sharding)
    moved = dataclasses.replace(arg, id=9)
    rotated = dataclasses.replace(program, body=(Communicate(step, arg, moved),
                                                 dataclasses.replace(op, inputs=(moved,))))
    text = emit_partitioned(rotated, "shard")
    assert "%a_1 = shard.shift %a on @mesh grid_axes = [0] shift_axis = 0 offset = 1 rotate : tensor<2xf32> -> tensor<2xf32>" in text
    verify(text, "shard")


def test_emission_is_deterministic_and_ssa_names_are_unique():
    plan = zoo_plans(1)[5]
    first, second = emit_annotated(plan, "mesh"), emit_annotated(plan, "mesh")
    assert first == second
    defined = re.findall(r"^\s*(%[\w$.]+)(?::\d+)? =", first, re.M)
    assert len(defined) == len(set(defined))


def test_bad_input_is_an_input_error():
    plan = megatron()
    broken = Plan(plan.graph, plan.mesh, {**plan.options, "fc1": O((("pp",), (), ()))}, plan.storage)
    for emit in (emit_annotated, emit_partitioned):
        with pytest.raises(InputError) as caught:
            emit(broken)
        assert any(p.where == "/ops/fc1" for p in caught.value.problems)
    with pytest.raises(InputError, match="unknown dialect 'tosa'"):
        emit_annotated(plan, "tosa")
    with pytest.raises(InputError, match="argument convention"):
        emit_partitioned(plan, "mesh", "sliced")


# --- golden files ------------------------------------------------------------------------------


def embedding_vocab_split() -> SpmdProgram:
    mesh = Mesh.of(x=2, y=2)
    graph = graph_from_json(ZOO["embedding"], mesh)
    return partition(Plan(graph, mesh, {"lookup": O((("x",), (), (), ("y",)))}, {"ids": S((("x",),)), "table": S((("y",),))}))


def golden_modules() -> dict[str, tuple[str, str]]:
    """file name -> (module text, dialect)."""
    mlp = megatron()
    mesh = Mesh.of(x=2, y=2)
    reduction = Plan(graph_from_json(ZOO["reduction"], mesh), mesh,
                     {"rowsum": O(((), ("x",))), "rowmax": O((("y",), ("x",))), "colmean": O(((), ())),
                      "all": O((("y",),))}, {"x": S()})
    attention = Plan(graph_from_json(ZOO["attention"], mesh), mesh, {"sdpa": O((("x",), (), ("y",), (), (), ()))},
                     {"q": S(), "k": S(), "v": S()})
    return {
        "mlp_annotated.mesh.mlir": (emit_annotated(mlp, "mesh"), "mesh"),
        "mlp_annotated.shard.mlir": (emit_annotated(mlp, "shard"), "shard"),
        "mlp_partitioned_local.mesh.mlir": (emit_partitioned(mlp, "mesh"), "mesh"),
        "mlp_partitioned_global.shard.mlir": (emit_partitioned(mlp, "shard", "global"), "shard"),
        "mlp_2d_optimized.mesh.mlir": (emit_partitioned(optimize(partition(mlp2d()))[0], "mesh"), "mesh"),
        "reduction_annotated.mesh.mlir": (emit_annotated(reduction, "mesh"), "mesh"),
        "attention_causal_partitioned.shard.mlir": (emit_partitioned(attention, "shard"), "shard"),
        "embedding_vocab_split.shard.mlir": (emit_partitioned(embedding_vocab_split(), "shard"), "shard"),
    }


@pytest.mark.parametrize("name", sorted(golden_modules()))
def test_golden_module(name):
    text, dialect = golden_modules()[name]
    path = GOLDEN / name
    if os.environ.get("AUTOSHARD_UPDATE_GOLDEN"):
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"{name} changed; rerun with AUTOSHARD_UPDATE_GOLDEN=1 if that is intended"
    verify(text, dialect)


def test_golden_programs_keep_their_collectives():
    optimized, changes = optimize(partition(mlp2d()))
    assert [c.rewrite for c in changes] == ["decompose_all_reduce"]
    assert [c.step.kind for c in optimized.communicates()] == ["all_gather", "reduce_scatter", "all_gather",
                                                              "reduce_scatter"]
    relu = next(op for op in optimized.local_ops() if op.op.name == "relu")
    assert relu.option == O(((), (), ("b", "c", "a")))  # the relu now runs on an eighth of h
    program = embedding_vocab_split()
    assert isinstance(program.body[0], LocalOp) and program.body[0].outputs[0].sharding.partial_axes == ("y",)


def test_an_opaque_op_is_refused_naming_its_primitive():
    graph = graph_from_json(graph_doc("opaque", {"a": ((4,), "f32", "input"), "c": ((4,), "f32")},
                                      [("sorted", "opaque", ["a"], ["c"], {"shape": [4], "dtype": "f32", "primitive": "sort"})]))
    plan = Plan(graph, Mesh.of(x=2), {"sorted": ShardingOption(((),) * 2)}, {"a": Sharding()})
    with pytest.raises(InputError, match="op 'sorted' is opaque \\(framework primitive 'sort'\\)"):
        emit_partitioned(partition(plan))
