"""Strategy enumeration: every legal assignment of mesh axes to loops, nothing illegal."""

from __future__ import annotations

from autoshard.mesh import Mesh
from autoshard.ops import OP_KINDS
from autoshard.planning.options import ShardingOption, check_option, enumerate_options, enumerate_storage
from autoshard.sharding import Sharding


def test_matmul_options_on_a_2d_mesh_are_all_axis_assignments():
    mesh = Mesh.of(a=2, b=2)
    nest = OP_KINDS["matmul"].loops([(8, 8), (8, 8)], {})
    options = enumerate_options(nest, mesh)
    # each of 2 axes: one of 3 loops or none (16), plus both axes on one loop in the other order (3)
    assert len(options) == 16 + 3
    assert options[0] == ShardingOption.replicated(3)
    assert ShardingOption((("a", "b"), (), ())) in options and ShardingOption((("b", "a"), (), ())) in options
    assert len(set(options)) == len(options)
    for option in options:
        check_option(nest, option, mesh)


def test_invalid_and_too_small_loops_are_never_split():
    mesh = Mesh.of(x=4)
    softmax = OP_KINDS["softmax"].loops([(8, 16)], {})
    assert enumerate_options(softmax, mesh) == [ShardingOption(((), ())), ShardingOption((("x",), ()))]
    tiny = OP_KINDS["exp"].loops([(2, 16)], {})  # dim of 2 cannot be split 4 ways
    assert ShardingOption((("x",), ())) not in enumerate_options(tiny, mesh)


def test_uneven_split_is_kept_but_one_leaving_a_device_empty_is_not():
    mesh = Mesh.of(x=4)
    assert ShardingOption((("x",),)) in enumerate_options(OP_KINDS["exp"].loops([(10,)], {}), mesh)  # 3,3,3,1
    assert ShardingOption((("x",),)) not in enumerate_options(OP_KINDS["exp"].loops([(5,)], {}), mesh)  # 2,2,1,0


def test_reshape_merge_needs_a_dividing_split():
    mesh = Mesh.of(x=4)
    ok = OP_KINDS["reshape"].loops([(8, 3)], {"shape": [24]})
    bad = OP_KINDS["reshape"].loops([(6, 3)], {"shape": [18]})
    assert ShardingOption((("x",), ())) in enumerate_options(ok, mesh)
    assert ShardingOption((("x",), ())) not in enumerate_options(bad, mesh)


def test_axes_of_size_one_are_left_out():
    mesh = Mesh.of(a=1, b=2)
    options = enumerate_options(OP_KINDS["exp"].loops([(4, 4)], {}), mesh)
    assert all("a" not in o.used_axes() for o in options) and len(options) == 3


def test_storage_shardings():
    mesh = Mesh.of(a=2, b=2)
    stored = enumerate_storage((8, 8), mesh)
    assert stored[0] == Sharding() and len(stored) == 9 + 2
    assert Sharding((("b", "a"),)) in stored
    assert all(not s.is_partial for s in stored)


def test_mesh_order_keeps_only_splits_in_mesh_order():
    mesh = Mesh.of(a=2, b=2)
    nest = OP_KINDS["matmul"].loops([(8, 8), (8, 8)], {})
    options = enumerate_options(nest, mesh, mesh_order=True)
    # each axis on one of 3 loops or none; two axes on one loop in the mesh's order only
    assert len(options) == 16
    assert ShardingOption((("a", "b"), (), ())) in options and ShardingOption((("b", "a"), (), ())) not in options
    assert set(options) <= set(enumerate_options(nest, mesh))
    stored = enumerate_storage((8, 8), mesh, mesh_order=True)
    assert len(stored) == 9 and Sharding((("a", "b"),)) in stored and Sharding((("b", "a"),)) not in stored
