"""Properties of halo shardings in the simulator: for random 1-D/2-D tensors split over 1-D/2-D
meshes with random halos, plain -> halo -> plain round trips exactly, every in-tensor halo cell
equals the block cell of the device that owns it, and padding stays zero."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from autoshard.mesh import Mesh
from autoshard.resharding import bytes_moved_price, plan_resharding
from autoshard.sharding import Sharding, ceildiv
from autoshard.sim import apply_resharding, assemble, distribute


@st.composite
def halo_cases(draw):
    mesh = Mesh.of(**{name: draw(st.integers(1, 3)) for name in draw(st.sampled_from([("x",), ("x", "y")]))})
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=1, max_size=2)))
    split: list[list[str]] = [[] for _ in shape]
    for axis in draw(st.permutations(mesh.axis_names)):
        dim = draw(st.integers(-1, len(shape) - 1))  # -1: the axis stays unused
        if dim >= 0:
            split[dim].append(axis)
    plain = Sharding(tuple(tuple(a) for a in split))
    halos = []
    for dim, size in enumerate(shape):
        block = ceildiv(size, plain.shard_count(mesh, dim))
        halos.append((draw(st.integers(0, block)), draw(st.integers(0, block))) if split[dim] else (0, 0))
    if not any(halos):
        halos = []
    values = np.arange(1, int(np.prod(shape)) + 1, dtype=np.int64).reshape(shape)
    return mesh, values, plain, plain.with_halo(tuple(halos))


def owners(mesh: Mesh, plain: Sharding, shape: tuple[int, ...], cell: tuple[int, ...]) -> list:
    """Every device whose block holds `cell`."""
    return [d for d in mesh.devices()
            if all(s.start <= c < s.stop for s, c in zip(plain.device_slices(mesh, shape, d), cell))]


@settings(max_examples=60, deadline=None)
@given(halo_cases())
def test_plain_to_halo_to_plain_round_trips_with_neighbour_halos(case):
    mesh, values, plain, haloed = case
    shape = values.shape
    price = bytes_moved_price(mesh)
    plain_shards = distribute(values, mesh, plain)
    there = apply_resharding(plain_shards, mesh, plan_resharding(mesh, shape, 8, plain, haloed, price))
    for device in mesh.devices():
        box = haloed.device_box(mesh, shape, device)
        local = there[device]
        assert local.shape == tuple(b - a for a, b in box)
        for cell in itertools.product(*(range(a, b) for a, b in box)):
            held = local[tuple(c - a for c, (a, _) in zip(cell, box))]
            if not all(0 <= c < n for c, n in zip(cell, shape)):
                assert held == 0  # padding
                continue
            for owner in owners(mesh, plain, shape, cell):
                start = [s.start for s in plain.device_slices(mesh, shape, owner)]
                assert held == plain_shards[owner][tuple(c - a for c, a in zip(cell, start))] == values[cell]
    np.testing.assert_array_equal(assemble(there, mesh, haloed, shape), values)
    back = apply_resharding(there, mesh, plan_resharding(mesh, shape, 8, haloed, plain, price))
    for device in mesh.devices():
        np.testing.assert_array_equal(back[device], plain_shards[device])
