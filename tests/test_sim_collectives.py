"""The mesh collectives against every figure of the mesh reference (003_e3bdb7ab501b66d8.txt),
plus uneven pieces, reductions, undefined results and the general permute."""

from __future__ import annotations

import numpy as np
import pytest

from autoshard.mesh import Mesh
from autoshard.sim import collectives as c
from autoshard.sim.collectives import UndefinedValueError

MESH_2x2 = Mesh.of(m0=2, m1=2)

# The 2x2 input drawn for all_gather, gather and reduce_scatter.
QUAD = {(0, 0): [[1, 2], [3, 4]], (0, 1): [[5, 6], [7, 8]], (1, 0): [[9, 10], [11, 12]], (1, 1): [[13, 14], [15, 16]]}


def arrays(contents):
    return {d: np.array(v) for d, v in contents.items()}


def assert_contents(shards, expected):
    assert set(shards) == set(expected)
    for device, value in expected.items():
        np.testing.assert_array_equal(shards[device], np.array(value), err_msg=f"device {device}")


def test_all_gather_figure():
    out = c.all_gather(arrays(QUAD), MESH_2x2, ("m1",), 1)
    row0, row1 = [[1, 2, 5, 6], [3, 4, 7, 8]], [[9, 10, 13, 14], [11, 12, 15, 16]]
    assert_contents(out, {(0, 0): row0, (0, 1): row0, (1, 0): row1, (1, 1): row1})


def test_all_slice_figure_inverts_all_gather():
    row0, row1 = [[1, 2, 5, 6], [3, 4, 7, 8]], [[9, 10, 13, 14], [11, 12, 15, 16]]
    out = c.all_slice(arrays({(0, 0): row0, (0, 1): row0, (1, 0): row1, (1, 1): row1}), MESH_2x2, ("m1",), 1)
    assert_contents(out, QUAD)


def test_all_to_all_figure():
    mesh = Mesh.of(m0=3)
    inputs = {(i,): [[10 * (i + 1) + 1, 10 * (i + 1) + 2], [10 * (i + 1) + 3, 10 * (i + 1) + 4],
                     [10 * (i + 1) + 5, 10 * (i + 1) + 6]] for i in range(3)}
    out = c.all_to_all(arrays(inputs), mesh, ("m0",), 0, 0)
    assert_contents(out, {(0,): [[11, 12], [21, 22], [31, 32]], (1,): [[13, 14], [23, 24], [33, 34]],
                          (2,): [[15, 16], [25, 26], [35, 36]]})


def test_broadcast_figure():
    # Devices (1, 0) and (1, 1) are drawn empty: they hold nothing the broadcast reads.
    out = c.broadcast(arrays({(0, 0): [1, 2], (0, 1): [3, 4]}), MESH_2x2, ("m0",), (0,))
    assert_contents(out, {(0, 0): [1, 2], (0, 1): [3, 4], (1, 0): [1, 2], (1, 1): [3, 4]})


def test_gather_figure_leaves_non_roots_undefined():
    out = c.gather(arrays(QUAD), MESH_2x2, ("m1",), 1, (1,))
    assert_contents(out, {(0, 1): [[1, 2, 5, 6], [3, 4, 7, 8]], (1, 1): [[9, 10, 13, 14], [11, 12, 15, 16]]})
    with pytest.raises(UndefinedValueError, match=r"\(0, 0\)"):
        c.all_reduce(out, MESH_2x2, ("m1",))


def test_reduce_scatter_figure():
    # The reference's example text says `reduction = <max>`, but its figure is the sum
    # (6 8 = 1 2 + 5 6); the figure is the spec for sum, and max is checked separately.
    out = c.reduce_scatter(arrays(QUAD), MESH_2x2, ("m1",), 0, "sum")
    assert_contents(out, {(0, 0): [[6, 8]], (0, 1): [[10, 12]], (1, 0): [[22, 24]], (1, 1): [[26, 28]]})
    out = c.reduce_scatter(arrays(QUAD), MESH_2x2, ("m1",), 0, "max")
    assert_contents(out, {(0, 0): [[5, 6]], (0, 1): [[7, 8]], (1, 0): [[13, 14]], (1, 1): [[15, 16]]})


def test_scatter_figure():
    out = c.scatter(arrays({(1, 0): [[1, 2], [3, 4]], (1, 1): [[5, 6], [7, 8]]}), MESH_2x2, ("m0",), 0, (1,))
    assert_contents(out, {(0, 0): [[1, 2]], (1, 0): [[3, 4]], (0, 1): [[5, 6]], (1, 1): [[7, 8]]})


def test_shift_figure_rotates_by_two():
    mesh = Mesh.of(m0=2, m1=4)
    inputs = arrays({(r, k): [4 * r + k + 1] for r in range(2) for k in range(4)})
    out = c.shift(inputs, mesh, ("m1",), "m1", 2, rotate=True)
    assert_contents(out, {(0, 0): [3], (0, 1): [4], (0, 2): [1], (0, 3): [2],
                          (1, 0): [7], (1, 1): [8], (1, 2): [5], (1, 3): [6]})


def test_shift_direction_and_undefined_ends():
    # The figure (offset 2 of 4) reads the same both ways; here data moves up by `offset`.
    mesh = Mesh.of(m0=4)
    inputs = arrays({(k,): [k] for k in range(4)})
    assert_contents(c.shift(inputs, mesh, ("m0",), "m0", 1, rotate=True), {(0,): [3], (1,): [0], (2,): [1], (3,): [2]})
    assert_contents(c.shift(inputs, mesh, ("m0",), "m0", 1), {(1,): [0], (2,): [1], (3,): [2]})
    assert_contents(c.shift(inputs, mesh, ("m0",), "m0", -1), {(0,): [1], (1,): [2], (2,): [3]})
    with pytest.raises(ValueError, match="shift_axis"):
        c.shift(inputs, mesh, (), "m0", 1)


@pytest.mark.parametrize("reduction, expected", [("sum", 21), ("max", 6), ("min", 1), ("product", 720)])
def test_all_reduce_kinds_over_two_axes(reduction, expected):
    mesh = Mesh.of(m0=2, m1=3, m2=2)
    inputs = {d: np.array([d[0] * 3 + d[1] + 1, d[2]]) for d in mesh.devices()}
    out = c.all_reduce(inputs, mesh, ("m1", "m0"), reduction)
    for d in mesh.devices():
        other = {"sum": 6 * d[2], "max": d[2], "min": d[2], "product": d[2] ** 6}[reduction]
        np.testing.assert_array_equal(out[d], [expected, other])


def test_reduce_to_root():
    mesh = Mesh.of(m0=2, m1=3)
    inputs = {d: np.array([mesh.linear_index(d)]) for d in mesh.devices()}
    out = c.reduce(inputs, mesh, ("m1",), (2,), "max")
    assert_contents(out, {(0, 2): [2], (1, 2): [5]})


def test_in_group_order_follows_mesh_axes_order():
    mesh = Mesh.of(m0=2, m1=2)
    inputs = {d: np.array([10 * d[0] + d[1]]) for d in mesh.devices()}
    out = c.all_gather(inputs, mesh, ("m1", "m0"), 0)
    np.testing.assert_array_equal(out[(1, 1)], [0, 10, 1, 11])


def test_uneven_pieces():
    mesh = Mesh.of(m0=3)
    # all_slice cuts by ceildiv bounds: 5 -> 2, 2, 1 and 4 -> 2, 2, 0.
    sliced = c.all_slice({(i,): np.arange(5) for i in range(3)}, mesh, ("m0",), 0)
    assert_contents(sliced, {(0,): [0, 1], (1,): [2, 3], (2,): [4]})
    sliced = c.all_slice({(i,): np.arange(4) for i in range(3)}, mesh, ("m0",), 0)
    assert [sliced[(i,)].size for i in range(3)] == [2, 2, 0]
    # all_gather concatenates the pieces actually held.
    gathered = c.all_gather(sliced, mesh, ("m0",), 0)
    np.testing.assert_array_equal(gathered[(2,)], np.arange(4))
    # all_to_all of uneven pieces: device j receives piece j of everyone.
    inputs = {(i,): np.arange(5) + 10 * i for i in range(3)}
    out = c.all_to_all({d: x.reshape(1, 5) for d, x in inputs.items()}, mesh, ("m0",), 1, 0)
    np.testing.assert_array_equal(out[(2,)], [[4], [14], [24]])
    assert out[(0,)].shape == (3, 2)


def test_send_recv_replaces_only_the_destination():
    mesh = Mesh.of(m0=2, m1=3)
    inputs = {d: np.array([mesh.linear_index(d)]) for d in mesh.devices()}
    out = c.send_recv(inputs, mesh, ("m1",), (0,), (2,))
    assert_contents(out, {(0, 0): [0], (0, 1): [1], (0, 2): [0], (1, 0): [3], (1, 1): [4], (1, 2): [3]})
    with pytest.raises(ValueError, match="in-group device"):
        c.send_recv(inputs, mesh, ("m1",), (0,), (3,))


def test_permute_tiles_and_coverage():
    inputs = {(0,): np.array([[1, 2], [3, 4]]), (1,): np.array([[5, 6], [7, 8]])}
    transfers = [((0,), (1,), ((0, 2), (0, 1)), ((0, 2), (0, 1))), ((1,), (1,), ((0, 2), (1, 2)), ((0, 2), (1, 2))),
                 ((1,), (0,), ((0, 2), (0, 2)), ((0, 2), (0, 2)))]
    out = c.permute(inputs, transfers, {(0,): (2, 2), (1,): (2, 2)})
    assert_contents(out, {(0,): [[5, 6], [7, 8]], (1,): [[1, 6], [3, 8]]})
    with pytest.raises(UndefinedValueError, match=r"\(1,\)"):
        c.permute(inputs, transfers[:1], {(1,): (2, 2)})
