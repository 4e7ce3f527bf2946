"""Halo shards on devices, and the reference's `update_halo`.

A device's local tensor under a halo sharding is its box (`Sharding.device_box`): its block plus
`start`/`end` cells copied from the neighbouring shards. Box cells outside the tensor are padding:
zeros when a tensor is laid out, and never written by `update_halo` (so the halos at the tensor's
edges keep whatever the destination buffer held there).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

import numpy as np

from autoshard.mesh import Device, Mesh
from autoshard.sharding import Sharding
from autoshard.sim.collectives import Shards

Box = tuple[tuple[int, int], ...]


def owned_pieces(mesh: Mesh, sharding: Sharding, shape: Sequence[int], box: Box) -> Iterator[tuple[Box, tuple[int, ...]]]:
    """The in-tensor part of `box` cut into pieces each held by one shard: (global box, shard index per dim)."""
    per_dim = []
    for dim, size in enumerate(shape):
        low, high = max(box[dim][0], 0), min(box[dim][1], size)
        per_dim.append([((max(a, low), min(b, high)), k) for k, (a, b) in enumerate(sharding.dim_bounds(mesh, size, dim))
                        if max(a, low) < min(b, high)])
    for combo in itertools.product(*per_dim):
        yield tuple(cells for cells, _ in combo), tuple(k for _, k in combo)


def shard_device(mesh: Mesh, sharding: Sharding, device: Device, shard_index: Sequence[int]) -> Device:
    """The device of `device`'s group (same coordinates on every other axis) that holds `shard_index`."""
    coords = list(device)
    for dim, index in enumerate(shard_index):
        for axis in reversed(sharding.dim_axes(dim)):  # first axis major
            size = mesh.axis_size(axis)
            coords[mesh.axis_index(axis)] = index % size
            index //= size
    return tuple(coords)


def local_slices(cells: Box, box: Box) -> tuple[slice, ...]:
    """Where the global `cells` sit in the local tensor spanning `box`."""
    return tuple(slice(a - start, b - start) for (a, b), (start, _) in zip(cells, box))


def update_halo(shards: Shards, mesh: Mesh, shape: Sequence[int], source: Sharding, destination: Sharding,
                into: Shards | None = None) -> Shards:
    """The reference's `update_halo`: every device's `destination` box (a fresh zero buffer, or its
    `into` tensor) receives its block from its own `source` shard and its halo cells from the shards of
    its neighbours along the split axes. `source` and `destination` differ only in their halos."""
    if source.without_halo() != destination.without_halo():
        raise ValueError(f"update_halo keeps the split: {source} and {destination} differ beyond their halos")
    for device in mesh.devices():
        if shards[device].shape != source.local_shape(mesh, shape, device):
            raise ValueError(f"update_halo: device {device} holds shape {shards[device].shape}, "
                             f"{source} of {tuple(shape)} needs {source.local_shape(mesh, shape, device)}")
    out: Shards = {}
    for device in mesh.devices():
        box = destination.device_box(mesh, shape, device)
        held = shards[device]
        if into is None:
            local = np.zeros(tuple(b - a for a, b in box), held.dtype)
        else:
            local = into[device].copy()
            if local.shape != tuple(b - a for a, b in box):
                raise ValueError(f"update_halo: device {device}'s destination has shape {local.shape}, "
                                 f"{destination} of {tuple(shape)} needs {tuple(b - a for a, b in box)}")
        for cells, shard_index in owned_pieces(mesh, destination, shape, box):
            owner = shard_device(mesh, destination, device, shard_index)
            local[local_slices(cells, box)] = shards[owner][local_slices(cells, source.device_box(mesh, shape, owner))]
        out[device] = local
    return out


def stale_halo_devices(shards: Shards, mesh: Mesh, shape: Sequence[int], sharding: Sharding) -> list[Device]:
    """Devices whose in-tensor halo cells differ from the blocks of the shards they copy."""
    fresh = update_halo(shards, mesh, shape, sharding, sharding, into=shards)
    floating = next(iter(shards.values())).dtype.kind in "fc"
    return [d for d in mesh.devices() if not np.array_equal(fresh[d], shards[d], equal_nan=floating)]
