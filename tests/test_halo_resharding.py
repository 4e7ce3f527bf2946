"""Resharding to, from and between halo shardings: `update_halo` steps, priced as point-to-point
traffic of the halo cells each device receives, run in the simulator, printed in both spellings
and checked by the real MLIR tools; and `autoshard reshard` with halo shardings."""

from __future__ import annotations

import json

import pytest

from autoshard.cli.main import main
from autoshard.mesh import Mesh
from autoshard.mlir import emit_partitioned
from autoshard.mlir.toolchain import ToolchainError, as_shard_spelling, verify
from autoshard.resharding import bytes_moved_price, halo_step, plan_resharding
from autoshard.resharding.geometry import received_elements
from autoshard.sharding import Sharding
from autoshard.sim.reshard_check import verify_resharding
from autoshard.spmd.program import resharding_program

MESH4 = Mesh.of(x=4)
ROWS = Sharding((("x",),))


def halo(flat: list[int], split: str = '[["x"]]') -> Sharding:
    return Sharding.parse({"split_axes": json.loads(split), "halo_sizes": flat})


def plan(mesh: Mesh, shape: tuple[int, ...], source: Sharding, target: Sharding):
    return plan_resharding(mesh, shape, 4, source, target, bytes_moved_price(mesh))


def test_height_split_gets_its_halo_rows_in_one_update_halo():
    """16x8 f32, height split over 4 devices, halo [1, 1]: interior devices receive a row from each
    neighbour, edge devices one row; nothing is sent across the tensor's edges."""
    resharding = plan(MESH4, (16, 8), ROWS, halo([1, 1]))
    (step,) = resharding.steps
    row_bytes = 8 * 4
    assert step.kind == "update_halo" and step.mesh_axes == ("x",)
    assert dict(step.dims) == {"source_halo_sizes": (0, 0), "destination_halo_sizes": (1, 1)}
    assert step.bytes_per_device == 2 * row_bytes
    assert step.seconds == pytest.approx(2 * row_bytes / 1e9)  # send_recv at 1 GB/s, ring factor 1
    assert received_elements(MESH4, (16, 8), step) == {(0,): 8.0, (1,): 16.0, (2,): 16.0, (3,): 8.0}
    assert step.in_local_shape == (4, 8) and step.out_local_shape == (6, 8)
    assert verify_resharding(MESH4, resharding).passed


def test_dropping_halos_is_local_and_free():
    resharding = plan(MESH4, (10, 6), halo([2, 2]), ROWS)
    (step,) = resharding.steps
    assert step.kind == "update_halo" and step.bytes_per_device == 0 and step.seconds == 0.0
    assert resharding.max_bytes_received_per_device == 0
    assert verify_resharding(MESH4, resharding).passed


def test_changing_halos_sends_only_the_cells_a_device_lacks():
    resharding = plan(MESH4, (10, 6), halo([1, 2]), halo([2, 0]))
    (step,) = resharding.steps
    assert dict(step.dims) == {"source_halo_sizes": (1, 2), "destination_halo_sizes": (2, 0)}
    assert step.bytes_per_device == 1 * 6 * 4  # the second start row
    assert verify_resharding(MESH4, resharding).passed


def test_a_new_split_drops_the_old_halos_first_and_adds_the_new_last():
    mesh = Mesh.of(x=2, y=2)
    source = halo([1, 0, 0, 1], '[["x"], ["y"]]')
    target = halo([1, 1, 0, 0], '[["y"], ["x"]]')
    resharding = plan(mesh, (8, 6), source, target)
    kinds = [s.kind for s in resharding.steps]
    assert kinds[0] == "update_halo" and kinds[-1] == "update_halo" and len(kinds) >= 3
    assert resharding.steps[0].bytes_per_device == 0
    assert not resharding.steps[0].after.has_halo and resharding.steps[-1].after.halo_sizes == ((1, 1),)
    assert resharding.steps[-1].after.split_axes == (("y",), ("x",))
    assert verify_resharding(mesh, resharding).passed


@pytest.mark.parametrize("mesh, shape, source, target", [
    ("x=4", (10, 6), "[[x]]", halo([1, 2])),
    ("x=4", (10, 6), halo([2, 2]), halo([1, 0])),
    ("x=2,y=3", (7, 5), "[[x],[y]]", halo([1, 1, 1, 0], '[["x"], ["y"]]')),
    ("x=2,y=2", (8, 6), "[[], [x]]", halo([1, 1], '[["x", "y"]]')),
])
@pytest.mark.parametrize("dialect", ["mesh", "shard"])
def test_halo_reshardings_print_ir_the_tools_accept(mesh, shape, source, target, dialect):
    mesh = Mesh.parse(mesh)
    resharding = plan(mesh, shape, Sharding.parse(source), target)
    assert verify_resharding(mesh, resharding).passed
    ir = emit_partitioned(resharding_program(mesh, resharding, "f32", bytes_moved_price(mesh)), dialect)
    verify(ir, dialect)
    grows = any(s.bytes_per_device for s in resharding.steps if s.kind == "update_halo")
    assert (f"{dialect}.update_halo" in ir) == grows
    if dialect == "mesh" and grows:
        assert " into %halo_buffer on @mesh split_axes = " in ir and "destination_halo_sizes = " in ir


MESH_MODULE = """mesh.mesh @mesh(shape = 4)
func.func @f(%x: tensor<2x6xf32>) -> tensor<4x6xf32> {
  %s = mesh.sharding @mesh split_axes = [[0]] partial = sum[0] halo_sizes = [1, 1] : !mesh.sharding
  %a = mesh.shard %x to %s : tensor<2x6xf32>
  %e = tensor.empty() : tensor<4x6xf32>
  %r = mesh.update_halo %a into %e on @mesh split_axes = [[0]] source_halo_sizes = [0, 0] destination_halo_sizes = [1, 1] : tensor<2x6xf32> -> tensor<4x6xf32>
  return %r : tensor<4x6xf32>
}
"""


def test_the_mesh_spelling_of_halos_is_checked_by_llvm22_after_a_rename():
    renamed = as_shard_spelling(MESH_MODULE)
    assert "shard.grid @mesh(shape = 4)" in renamed and "partial" not in renamed
    assert "%r = shard.update_halo %e on @mesh split_axes = [[0]] halo_sizes = [1, 1] : tensor<4x6xf32>" in renamed
    verify(MESH_MODULE, "mesh")
    # the source's declared type is still checked
    with pytest.raises(ToolchainError, match="mlir-opt-22 rejected"):
        verify(MESH_MODULE.replace(": tensor<2x6xf32> -> tensor<4x6xf32>", ": tensor<3x6xf32> -> tensor<4x6xf32>"), "mesh")
    with pytest.raises(ToolchainError, match="cover different numbers of split dims"):
        as_shard_spelling(MESH_MODULE.replace("source_halo_sizes = [0, 0]", "source_halo_sizes = [0, 0, 1, 1]"))
    with pytest.raises(ToolchainError, match="bad partial clause"):
        as_shard_spelling(MESH_MODULE.replace("partial = sum[0]", "partial = mean[0]"))


def test_reshard_cli_verifies_and_reports_halo_steps(capsys):
    code = main(["reshard", "--mesh", "x=4", "--shape", "16x8", "--from", "[[x]]",
                 "--to", '{"split_axes": [["x"]], "halo_sizes": [1, 1]}', "--verify", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["verify"]["passed"]
    assert out["target"] == {"split_axes": [["x"]], "halo_sizes": [1, 1]}
    assert [(s["kind"], s["bytes_per_device"], s["dims"]) for s in out["steps"]] == [
        ("update_halo", 64, {"source_halo_sizes": [0, 0], "destination_halo_sizes": [1, 1]})]
    assert out["target_shard_bytes"] == 6 * 8 * 4
    assert "mesh.update_halo %x into" in out["ir"]


@pytest.mark.parametrize("to, fragment", [
    ('{"split_axes": [["x"]], "halo_sizes": [1]}', "--to halo_sizes: halo_sizes needs two values"),
    ('{"split_axes": [["x"]], "halo_sizes": [0, 5]}', "--to: halo_sizes of dim 0 ([0, 5]) exceed the shard of 4 cells"),
    ('{"split_axes": [["x"]], "halo_sizes": [1, 1], "sharded_dims_offsets": [[0, 4, 8, 12, 16]]}',
     "--to halo_sizes: halo_sizes and sharded_dims_offsets are mutually exclusive"),
])
def test_reshard_cli_names_bad_halos(capsys, to, fragment):
    code = main(["reshard", "--mesh", "x=4", "--shape", "16x8", "--from", "[[x]]", "--to", to])
    assert code == 2
    assert fragment in capsys.readouterr().err


@pytest.mark.parametrize("dialect", ["mesh", "shard"])
def test_global_arguments_with_halos_are_cut_then_given_their_halos(dialect):
    source = halo([1, 2])
    resharding = plan(MESH4, (10, 6), source, ROWS)
    ir = emit_partitioned(resharding_program(MESH4, resharding, "f32", bytes_moved_price(MESH4)), dialect,
                          arguments="global")
    verify(ir, dialect)
    assert ir.count(f"{dialect}.update_halo") == 1 and "tensor<6x6xf32>" in ir  # 3-row blocks + 1 + 2


def test_halo_step_builds_one_update_halo_and_refuses_a_new_split():
    step = halo_step(MESH4, (16, 8), 4, ROWS, halo([1, 1]), bytes_moved_price(MESH4))
    assert step.kind == "update_halo" and step.bytes_per_device == 64 and step.out_local_shape == (6, 8)
    with pytest.raises(ValueError, match="an update_halo keeps the split"):
        halo_step(MESH4, (16, 8), 4, Sharding(((), ("x",))), halo([1, 1]), bytes_moved_price(MESH4))


def test_reshard_cli_text_lists_the_halo_sizes(capsys):
    code = main(["reshard", "--mesh", "x=4", "--shape", "16x8", "--from", "[[x]]",
                 "--to", '{"split_axes": [["x"]], "halo_sizes": [1, 1]}', "--verify"])
    out = capsys.readouterr().out
    assert code == 0
    assert ("1. update_halo over [x] (source_halo_sizes=[0, 0], destination_halo_sizes=[1, 1]): "
            "[[x]] -> [[x]] halo_sizes=[1, 1]; 64 B per device") in out
    assert "verify: PASS" in out
