"""Halo shardings (the reference's `halo_sizes`): the type, its JSON and IR spellings, and the
local box each device holds."""

from __future__ import annotations

import pytest

from autoshard.delivery.dtensor_placements import placement_specs
from autoshard.delivery.partition_specs import spec_problem
from autoshard.errors import InputError, ShardingError
from autoshard.mesh import Mesh
from autoshard.mlir.dialect import DIALECTS
from autoshard.mlir.module import sharding_attrs
from autoshard.mlir.toolchain import verify
from autoshard.sharding import Sharding

MESH4 = Mesh.of(x=4)


def test_halo_sizes_are_kept_per_dim_and_trailing_zeros_dropped():
    s = Sharding((("x",), ()), halo_sizes=((1, 2), (0, 0)))
    assert s.halo_sizes == ((1, 2),)
    assert s.halo(0) == (1, 2) and s.halo(1) == (0, 0) and s.halo(5) == (0, 0)
    assert s.has_halo and not s.without_halo().has_halo
    assert Sharding((("x",),), halo_sizes=((0, 0),)) == Sharding((("x",),))


@pytest.mark.parametrize("halos, fragment", [
    (((1,),), "two non-negative integers"),
    (((-1, 0),), "two non-negative integers"),
    (((True, 0),), "two non-negative integers"),
    (((0, 0), (1, 0)), r"dim 1 has a halo \[1, 0\] but is not split"),
])
def test_bad_halos_name_the_field(halos, fragment):
    with pytest.raises(ShardingError, match=fragment) as info:
        Sharding((("x",), ()), halo_sizes=halos)
    assert info.value.problems[0].where == "halo_sizes"


def test_halos_and_offsets_are_mutually_exclusive():
    with pytest.raises(ShardingError, match="halo_sizes and sharded_dims_offsets are mutually exclusive"):
        Sharding((("x",),), dims_offsets=((0, 1, 2, 3, 4),), halo_sizes=((1, 1),))


def test_json_spells_halos_flat_per_split_dim():
    s = Sharding.parse({"split_axes": [[], ["x"], [], ["y"]], "halo_sizes": [1, 2, 0, 3]})
    assert s.halo_sizes == ((0, 0), (1, 2), (0, 0), (0, 3))
    assert s.to_json() == {"split_axes": [[], ["x"], [], ["y"]], "halo_sizes": [1, 2, 0, 3]}
    assert Sharding.parse(s.to_json()) == s
    assert "halo_sizes" not in Sharding.parse({"split_axes": [["x"]]}).to_json()
    assert str(s) == "[[], [x], [], [y]] halo_sizes=[1, 2, 0, 3]"


@pytest.mark.parametrize("doc, fragment", [
    ({"split_axes": [["x"]], "halo_sizes": [1]}, "two values .* for each of the 1 split dims, 2 in all; got 1"),
    ({"split_axes": [["x"], ["y"]], "halo_sizes": [1, 1]}, "2 split dims, 4 in all; got 2"),
    ({"split_axes": [["x"]], "halo_sizes": [1, -2]}, "non-negative integers"),
    ({"split_axes": [["x"]], "halo_sizes": "1,2"}, "list of non-negative integers"),
    ({"split_axes": [[]], "halo_sizes": [1, 1]}, "0 split dims"),
])
def test_json_parse_errors_name_halo_sizes(doc, fragment):
    with pytest.raises(ShardingError, match=fragment) as info:
        Sharding.parse(doc)
    assert info.value.problems[0].where == "halo_sizes"


def test_the_reference_example_box_on_a_4x8_tensor():
    """`split_axes = [[0]] halo_sizes = [1, 2]` on @mesh0(2x2x4): 2-row blocks widened by 1 row above
    and 2 below, 5x8 on every device."""
    mesh = Mesh.of(a=2, b=2, c=4)
    s = Sharding.parse({"split_axes": [["a"]], "halo_sizes": [1, 2]})
    for device in mesh.devices():
        k = device[0]
        assert s.device_box(mesh, (4, 8), device) == ((2 * k - 1, 2 * k + 4), (0, 8))
        assert s.local_shape(mesh, (4, 8), device) == (5, 8)
        assert s.device_slices(mesh, (4, 8), device) == (slice(2 * k, 2 * k + 2), slice(0, 8))
    assert s.max_local_shape(mesh, (4, 8)) == (5, 8)


def test_uneven_split_boxes_have_one_length():
    s = Sharding.parse({"split_axes": [["x"]], "halo_sizes": [1, 1]})
    assert [s.device_box(MESH4, (10,), (k,)) for k in range(4)] == [((-1, 4),), ((2, 7),), ((5, 10),), ((8, 13),)]
    assert {s.local_shape(MESH4, (10,), (k,)) for k in range(4)} == {(5,)}
    assert s.max_local_shape(MESH4, (10,)) == (5,)


def test_a_halo_wider_than_the_shard_is_refused_by_check():
    s = Sharding.parse({"split_axes": [["x"]], "halo_sizes": [0, 3]})
    s.check(MESH4, (12,))
    with pytest.raises(ShardingError, match=r"halo_sizes of dim 0 \(\[0, 3\]\) exceed the shard of 2 cells"):
        s.check(MESH4, (8,))


def test_same_layout_tells_halos_apart():
    plain = Sharding((("x",),))
    halo = plain.with_halo(((1, 1),))
    assert not plain.same_layout(halo, MESH4, (8,))
    assert halo.same_layout(Sharding.parse({"split_axes": [["x"]], "halo_sizes": [1, 1]}), MESH4, (8,))


def test_ir_prints_halo_sizes_after_partial():
    mesh = Mesh.of(x=2, y=2)
    s = Sharding((("x",), (), ("y",)), halo_sizes=((1, 2), (0, 0), (0, 3)))
    assert sharding_attrs(mesh, s, (4, 4, 4), True) == "split_axes = [[0], [], [1]] halo_sizes = [1, 2, 0, 3]"
    partial = Sharding((("x",),), ("y",), "sum", (), ((2, 0),))
    assert sharding_attrs(mesh, partial, (4,), True) == "split_axes = [[0]] partial = sum[1] halo_sizes = [2, 0]"


def test_frameworks_refuse_halo_shardings_by_name():
    s = Sharding.parse({"split_axes": [["x"]], "halo_sizes": [1, 1]})
    with pytest.raises(InputError, match=r"tensor 'h' has halo_sizes \[1, 1\], which DTensor cannot express"):
        placement_specs(s, MESH4, "h")
    assert "halo_sizes [1, 1]" in spec_problem(s, MESH4, (8,), boundary=False)


@pytest.mark.parametrize("spelling", ["mesh", "shard"])
def test_annotations_with_halos_pass_the_tools_in_both_spellings(spelling):
    d = DIALECTS[spelling]
    mesh = Mesh.of(a=2, b=2, c=4)
    attrs = sharding_attrs(mesh, Sharding.parse({"split_axes": [["a"]], "halo_sizes": [1, 2]}), (4, 8), True)
    text = (f"{d.mesh_op} @mesh(shape = 2x2x4)\n"
            "func.func @f(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {\n"
            f"  %s = {d.sharding_op} @mesh {attrs} : {d.sharding_type}\n"
            f"  %a = {d.shard_op} %x to %s : tensor<4x8xf32>\n"
            "  return %a : tensor<4x8xf32>\n}\n")
    assert "split_axes = [[0]] halo_sizes = [1, 2]" in verify(text, spelling)
