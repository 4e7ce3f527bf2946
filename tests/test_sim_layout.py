"""Laying a tensor out per a sharding and putting it back together."""

from __future__ import annotations

import numpy as np
import pytest

from autoshard.mesh import Mesh
from autoshard.sharding import Sharding
from autoshard.sim import LayoutError, assemble, distribute
from autoshard.sim import collectives as c

MESH = Mesh.of(x=2, y=3)


@pytest.mark.parametrize("dtype", [np.int8, np.uint16, np.int64, np.float32])
@pytest.mark.parametrize("kind", ["sum", "max", "min", "product"])
def test_partial_layout_round_trips(dtype, kind):
    array = (np.arange(35).reshape(5, 7) % 11).astype(dtype)
    sharding = Sharding((("x",),), ("y",), kind)
    shards = distribute(array, MESH, sharding)
    assert shards[(1, 2)].shape == (2, 7)  # rows 3..4 of 5: the short last shard
    np.testing.assert_array_equal(assemble(shards, MESH, sharding, array.shape), array)
    # the reduction is what gives the value back: partial pieces differ across the group
    if kind != "product":
        assert any(not np.array_equal(shards[(0, 0)], shards[(0, k)]) for k in (1, 2))


@pytest.mark.parametrize("kind", ["sum", "max", "min", "product"])
def test_partial_bool_layout_round_trips(kind):
    array = (np.arange(35).reshape(5, 7) % 3) == 0
    sharding = Sharding((("x",),), ("y",), kind)
    shards = distribute(array, MESH, sharding)
    np.testing.assert_array_equal(assemble(shards, MESH, sharding, array.shape), array)
    # the pieces differ across the partial group: one holds the value, the others the identity
    identity = kind in ("min", "product")
    assert any(np.all(shards[(0, k)] == identity) and not np.all(shards[(0, 0)] == identity) for k in (1, 2))


def test_partial_sum_not_reduced_is_caught():
    array = np.arange(12).reshape(3, 4)
    shards = distribute(array, MESH, Sharding((), ("y",)))
    with pytest.raises(LayoutError, match=r"device \(0, 1\) disagrees with its replica \(0, 0\)"):
        assemble(shards, MESH, Sharding(), array.shape)
    reduced = c.all_reduce(shards, MESH, ("y",))
    np.testing.assert_array_equal(assemble(reduced, MESH, Sharding(), array.shape), array)


def test_split_layout_uses_ceildiv_bounds_and_empty_shards():
    array = np.arange(4)
    shards = distribute(array, MESH, Sharding((("y",),)))
    assert [shards[(0, k)].tolist() for k in range(3)] == [[0, 1], [2, 3], []]
    np.testing.assert_array_equal(assemble(shards, MESH, Sharding((("y",),)), (4,)), array)


def test_explicit_offsets():
    sharding = Sharding((("y",),), dims_offsets=((0, 1, 5, 6),))
    shards = distribute(np.arange(6), MESH, sharding)
    assert shards[(1, 1)].tolist() == [1, 2, 3, 4]
    np.testing.assert_array_equal(assemble(shards, MESH, sharding, (6,)), np.arange(6))


def test_assemble_names_the_bad_device():
    array = np.arange(6).reshape(2, 3)
    sharding = Sharding(((), ("y",)))
    shards = distribute(array, MESH, sharding)
    shards[(1, 2)] = np.zeros((2, 2), array.dtype)
    with pytest.raises(LayoutError, match=r"device \(1, 2\) holds shape \(2, 2\)"):
        assemble(shards, MESH, sharding, array.shape)
    del shards[(1, 2)]
    with pytest.raises(LayoutError, match=r"\(1, 2\)"):
        assemble(shards, MESH, sharding, array.shape)


def test_distribute_checks_shape_and_sharding():
    with pytest.raises(LayoutError, match="declared"):
        distribute(np.zeros((2, 3)), MESH, Sharding(), (3, 2))
    with pytest.raises(Exception, match="unknown mesh axis 'z'"):
        distribute(np.zeros((2, 3)), MESH, Sharding((("z",),)))
