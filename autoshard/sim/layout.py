"""Lay a global tensor out on every device of a mesh per a sharding, and put it back together.

Partial values get a deterministic decomposition whose reduction with the partial kind gives
the array back: for `sum` the in-group device 0 holds `array - sum(others)` and the others hold
small random integers (so a plan that forgets a reduction, or reads one device only, is caught);
for `max`/`min` the others hold values no larger/smaller than the array; for `product` ones.
The decomposition is exact for integer dtypes and for floats holding integers.

A halo sharding's shards are boxes (`autoshard.sim.halo`): halos hold the neighbours' cells and
cells outside the tensor hold zeros (padding).
"""

from __future__ import annotations

import functools
from typing import Sequence

import numpy as np

from autoshard.errors import AutoshardError
from autoshard.mesh import Device, Mesh
from autoshard.reductions import REDUCTIONS
from autoshard.sharding import Sharding
from autoshard.sim.collectives import Shards
from autoshard.sim.halo import local_slices, stale_halo_devices, update_halo


class LayoutError(AutoshardError):
    """Device contents do not form a valid layout of the sharding (wrong shape, replicas differ)."""


def _partial_parts(array: np.ndarray, kind: str, count: int, seed: int) -> list[np.ndarray]:
    """`count` arrays whose reduction with `kind`, in order, is `array`."""
    if count == 1:
        return [array]
    if array.dtype == np.bool_:
        # No arithmetic on bools: one part holds the value, the others the kind's identity.
        identity = np.full_like(array, REDUCTIONS[kind].identity(np.bool_))
        return [array, *(identity for _ in range(count - 1))]
    rng = np.random.default_rng(seed)
    noise = [rng.integers(0, 5, array.shape).astype(array.dtype) for _ in range(count - 1)]
    if kind == "sum":
        # Integer wrap-around is harmless: the sum wraps back.
        signed = [n - np.asarray(2, array.dtype) for n in noise]
        return [array - functools.reduce(np.add, signed), *signed]
    if kind == "max":
        return [array, *(np.minimum(array, array - n) for n in noise)]
    if kind == "min":
        return [array, *(np.maximum(array, array + n) for n in noise)]
    return [array, *(np.ones_like(array) for _ in noise)]


def distribute(array: np.ndarray, mesh: Mesh, sharding: Sharding, shape: Sequence[int] | None = None,
               *, seed: int = 0) -> Shards:
    """Every device's local tensor of `array` laid out per `sharding`."""
    array = np.asarray(array)
    if shape is not None and tuple(shape) != array.shape:
        raise LayoutError(f"array has shape {array.shape} but the tensor is declared {tuple(shape)}")
    sharding.check(mesh, array.shape, "sharding")
    count = mesh.group_size(sharding.partial_axes)
    parts = _partial_parts(array, sharding.partial_kind, count, seed)
    shards: Shards = {}
    for device in mesh.devices():
        part = parts[mesh.in_group_linear(device, sharding.partial_axes)]
        shards[device] = part[sharding.device_slices(mesh, array.shape, device)].copy()
    if sharding.has_halo:
        return update_halo(shards, mesh, array.shape, sharding.without_halo(), sharding)
    return shards


def _reduce_partial(shards: Shards, mesh: Mesh, sharding: Sharding) -> Shards:
    if not sharding.partial_axes:
        return shards
    ufunc = REDUCTIONS[sharding.partial_kind].pairwise
    reduced: Shards = {}
    for group in mesh.device_groups(sharding.partial_axes):
        shapes = {shards[d].shape for d in group}
        if len(shapes) != 1:
            raise LayoutError(f"devices {group} are partial over {list(sharding.partial_axes)} but hold shapes {sorted(shapes)}")
        total = functools.reduce(ufunc, (shards[d] for d in group))
        reduced.update({d: total for d in group})
    return reduced


def _blocks_of_halo_shards(shards: Shards, mesh: Mesh, sharding: Sharding, shape: Sequence[int]) -> Shards:
    """Each device's block out of its box, once every box has its shape and halos that agree with the
    blocks they copy (a halo is a replica of its neighbour's cells)."""
    for device in mesh.devices():
        expected = sharding.local_shape(mesh, shape, device)
        if shards[device].shape != expected:
            raise LayoutError(f"device {device} holds shape {shards[device].shape}; sharding {sharding} of "
                              f"{tuple(shape)} expects {expected}")
    stale = stale_halo_devices(shards, mesh, shape, sharding)
    if stale:
        raise LayoutError(f"devices {stale} hold halo cells that differ from their neighbours' blocks "
                          f"(sharding {sharding}); an update_halo is missing")
    blocks: Shards = {}
    for device in mesh.devices():
        box = sharding.device_box(mesh, shape, device)
        block = tuple((s.start, s.stop) for s in sharding.device_slices(mesh, shape, device))
        blocks[device] = shards[device][local_slices(block, box)]
    return blocks


def assemble(shards: Shards, mesh: Mesh, sharding: Sharding, shape: Sequence[int]) -> np.ndarray:
    """The global tensor the device contents stand for; raises LayoutError naming the device
    whose shard has the wrong shape or disagrees with a replica."""
    sharding.check(mesh, shape, "sharding")
    missing = [d for d in mesh.devices() if d not in shards]
    if missing:
        raise LayoutError(f"devices {missing} hold no value (an undefined result was used)")
    if sharding.has_halo:
        shards = _blocks_of_halo_shards(shards, mesh, sharding, shape)
        sharding = sharding.without_halo()
    values = _reduce_partial(shards, mesh, sharding)
    first = values[next(mesh.devices())]
    out = np.empty(tuple(shape), dtype=first.dtype)
    owner: dict[tuple[tuple[int, int], ...], Device] = {}
    for device in mesh.devices():
        slices = sharding.device_slices(mesh, shape, device)
        local = values[device]
        expected = tuple(s.stop - s.start for s in slices)
        if local.shape != expected:
            raise LayoutError(f"device {device} holds shape {local.shape}; sharding {sharding} of {tuple(shape)} expects {expected}")
        key = tuple((s.start, s.stop) for s in slices)
        if key not in owner:
            out[slices] = local
            owner[key] = device
        elif not np.array_equal(out[slices], local):
            raise LayoutError(f"device {device} disagrees with its replica {owner[key]} on the shard {[list(k) for k in key]}")
    return out
