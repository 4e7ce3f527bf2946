"""Halo shards in the simulator: the layout (block + halos, zeros outside the tensor) and
`update_halo` with exact values, edges included."""

from __future__ import annotations

import numpy as np
import pytest

from autoshard.mesh import Mesh
from autoshard.sharding import Sharding
from autoshard.sim import LayoutError, assemble, distribute
from autoshard.sim.halo import update_halo

MESH0 = Mesh.of(a=2, b=2, c=4)  # the reference's @mesh0(shape = 2x2x4)


def test_the_reference_example_lays_out_as_described():
    """`split_axes = [[0]] halo_sizes = [1, 2]` on a 4x8 tensor: 2-row blocks along mesh axis 0,
    one halo row at the start and two at the end of the sharded dim."""
    array = np.arange(32, dtype=np.int32).reshape(4, 8)
    sharding = Sharding.parse({"split_axes": [["a"]], "halo_sizes": [1, 2]})
    shards = distribute(array, MESH0, sharding)
    zero = np.zeros((1, 8), np.int32)
    first = np.concatenate([zero, array[0:2], array[2:4]])  # no row before row 0: padding
    second = np.concatenate([array[1:2], array[2:4], zero, zero])  # no rows after row 3: padding
    for device in MESH0.devices():
        expected = first if device[0] == 0 else second
        np.testing.assert_array_equal(shards[device], expected)
    np.testing.assert_array_equal(assemble(shards, MESH0, sharding, (4, 8)), array)


def test_two_dim_halos_fill_corners_from_the_diagonal_neighbour():
    mesh = Mesh.of(x=2, y=2)
    array = np.arange(1, 37, dtype=np.int64).reshape(6, 6)
    sharding = Sharding.parse({"split_axes": [["x"], ["y"]], "halo_sizes": [1, 1, 1, 1]})
    shards = distribute(array, mesh, sharding)
    padded = np.pad(array, 1)  # global coordinates shifted by one; the ring is padding
    for device in mesh.devices():
        r, c = device
        np.testing.assert_array_equal(shards[device], padded[3 * r:3 * r + 5, 3 * c:3 * c + 5])
    np.testing.assert_array_equal(assemble(shards, mesh, sharding, array.shape), array)


def test_update_halo_refreshes_interior_halos_and_leaves_edge_padding_alone():
    mesh = Mesh.of(x=4)
    array = np.arange(8, dtype=np.int32) + 10
    plain, halo = Sharding((("x",),)), Sharding((("x",),), halo_sizes=((1, 1),))
    sentinel = {d: np.full(4, -7, np.int32) for d in mesh.devices()}
    out = update_halo(distribute(array, mesh, plain), mesh, (8,), plain, halo, into=sentinel)
    assert [out[(k,)].tolist() for k in range(4)] == [[-7, 10, 11, 12], [11, 12, 13, 14], [13, 14, 15, 16],
                                                       [15, 16, 17, -7]]


def test_update_halo_between_halo_sizes_and_over_uneven_shards():
    mesh = Mesh.of(x=4)
    array = np.arange(10, dtype=np.int32) + 1  # blocks of 3: [1 2 3] [4 5 6] [7 8 9] [10]
    small = Sharding((("x",),), halo_sizes=((0, 1),))
    large = Sharding((("x",),), halo_sizes=((2, 1),))
    out = update_halo(distribute(array, mesh, small), mesh, (10,), small, large)
    assert [out[(k,)].tolist() for k in range(4)] == [[0, 0, 1, 2, 3, 4], [2, 3, 4, 5, 6, 7], [5, 6, 7, 8, 9, 10],
                                                       [8, 9, 10, 0, 0, 0]]
    np.testing.assert_array_equal(assemble(out, mesh, large, (10,)), array)


def test_update_halo_keeps_devices_apart_on_other_axes():
    mesh = Mesh.of(x=2, y=2)
    array = np.arange(8, dtype=np.int32).reshape(4, 2)
    sharding = Sharding((("y",), ("x",)), halo_sizes=((1, 0),))
    shards = distribute(array, mesh, sharding)
    # device (x, y): rows of block y with one row before it, column x
    assert shards[(1, 1)].tolist() == [[3], [5], [7]] and shards[(0, 0)].tolist() == [[0], [0], [2]]


def test_assemble_refuses_stale_halos_and_wrong_shapes():
    mesh = Mesh.of(x=2)
    array = np.arange(4, dtype=np.float32)
    sharding = Sharding((("x",),), halo_sizes=((1, 1),))
    shards = distribute(array, mesh, sharding)
    stale = dict(shards)
    stale[(1,)] = stale[(1,)].copy()
    stale[(1,)][0] = 99.0  # its copy of row 1
    with pytest.raises(LayoutError, match=r"devices \[\(1,\)\] hold halo cells that differ"):
        assemble(stale, mesh, sharding, (4,))
    padded_edge = dict(shards)
    padded_edge[(1,)] = padded_edge[(1,)].copy()
    padded_edge[(1,)][-1] = 5.0  # padding outside the tensor is nobody's copy
    np.testing.assert_array_equal(assemble(padded_edge, mesh, sharding, (4,)), array)
    with pytest.raises(LayoutError, match=r"holds shape \(2,\)"):
        assemble(distribute(array, mesh, sharding.without_halo()), mesh, sharding, (4,))


def test_partial_halo_values_round_trip():
    mesh = Mesh.of(x=2, y=2)
    array = np.arange(12, dtype=np.int32).reshape(6, 2)
    sharding = Sharding((("x",),), ("y",), "sum", halo_sizes=((1, 2),))
    shards = distribute(array, mesh, sharding)
    assert shards[(0, 0)].shape == (6, 2)
    np.testing.assert_array_equal(assemble(shards, mesh, sharding, array.shape), array)
