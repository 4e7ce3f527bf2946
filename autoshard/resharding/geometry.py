"""Where every device's shard lies, before and after a step: device boxes, the overlap of old
and new shards along each dim, what a device lacks of its new shard, and the direct exchange
(`device_transfers`) that fills each new shard from the devices holding its pieces.

Shards follow the reference's ceildiv cut (`pieces`) or explicit `sharded_dims_offsets`; dims
are independent, so every device's shard is a box with one range per dim.
"""

from __future__ import annotations

import itertools
import math
from functools import lru_cache

import numpy as np

from autoshard.mesh import Device, Mesh
from autoshard.resharding.steps import Box, CollectiveStep, Transfer, step_kind
from autoshard.sharding import Sharding, ceildiv


def pieces(length: int, count: int) -> list[tuple[int, int]]:
    """The reference's cut of `length` into `count` ceildiv pieces (as Sharding.dim_bounds)."""
    step = ceildiv(length, count)
    return [(min(k * step, length), min((k + 1) * step, length)) for k in range(count)]


@lru_cache(maxsize=4096)
def _boxes(mesh: Mesh, shape: tuple[int, ...], sharding: Sharding) -> np.ndarray:
    """`[device linear index, dim] -> (start, stop)`: Sharding.device_slices for all devices at once."""
    coords = np.indices(mesh.shape).reshape(len(mesh.shape), -1)
    out = np.empty((coords.shape[1], len(shape), 2), np.int64)
    for d, size in enumerate(shape):
        shard = np.zeros(coords.shape[1], np.int64)
        for axis in sharding.dim_axes(d):
            shard = shard * mesh.axis_size(axis) + coords[mesh.axis_index(axis)]
        out[:, d] = np.array(sharding.dim_bounds(mesh, size, d))[shard]
    return out


def _box(boxes: np.ndarray, index: int) -> Box:
    return tuple((int(a), int(b)) for a, b in boxes[index])


def _volume(box: Box) -> int:
    return math.prod(b - a for a, b in box)


@lru_cache(maxsize=1024)
def _shard_of_device(mesh: Mesh, axes: tuple[str, ...]) -> np.ndarray:
    """Per device (linear index): the index of its shard of a dim split over `axes`."""
    coords = np.indices(mesh.shape).reshape(len(mesh.shape), -1)
    shard = np.zeros(coords.shape[1], np.int64)
    for axis in axes:
        shard = shard * mesh.axis_size(axis) + coords[mesh.axis_index(axis)]
    return shard


@lru_cache(maxsize=65536)
def _dim_overlap(size: int, before: tuple[int, tuple[int, ...]], after: tuple[int, tuple[int, ...]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Along one dim cut into `count` shards or at explicit `offsets` as `before` and as `after`
    (each `(count, offsets)`): `[old shard, new shard]` overlap lengths, each new shard's length,
    and how many old shards each new shard meets."""
    old, new = (np.array(list(zip(offsets, offsets[1:])) if offsets else pieces(size, count)).reshape(-1, 2)
                for count, offsets in (before, after))
    overlap = np.clip(np.minimum(old[:, None, 1], new[None, :, 1]) - np.maximum(old[:, None, 0], new[None, :, 0]), 0, None)
    return overlap, new[:, 1] - new[:, 0], (overlap > 0).sum(axis=0)


@lru_cache(maxsize=65536)
def _dim_exchange(mesh: Mesh, size: int, old_axes: tuple[str, ...], old_offsets: tuple[int, ...],
                  new_axes: tuple[str, ...], new_offsets: tuple[int, ...]) -> np.ndarray:
    """Along one dim, per device (rows): its new range's length, the part its old range holds,
    and how many old ranges its new range meets."""
    overlap, length, met = _dim_overlap(size, (mesh.group_size(old_axes), old_offsets), (mesh.group_size(new_axes), new_offsets))
    old_shard, new_shard = _shard_of_device(mesh, old_axes), _shard_of_device(mesh, new_axes)
    rows = np.stack([length[new_shard], overlap[old_shard, new_shard], met[new_shard]])
    rows.flags.writeable = False  # cached and handed out as it is
    return rows


@lru_cache(maxsize=4096)
def _overlaps(mesh: Mesh, shape: tuple[int, ...], before: Sharding, after: Sharding) -> np.ndarray:
    """Per device (rows): elements of its new shard, of those its old shard holds, and the old
    shards its new shard meets."""
    whole, product = _split_dims_product(mesh, shape, before, after)
    if product is None:
        product = np.ones((3, mesh.num_devices), np.int64)
    return product * np.array([[whole], [whole], [int(whole > 0)]], np.int64)


def _split_dims_product(mesh: Mesh, shape: tuple[int, ...], before: Sharding,
                        after: Sharding) -> tuple[int, np.ndarray | None]:
    """The elements of the dims split in neither sharding (whole on every device) and `_overlaps`'
    rows over the other dims (None when there is none). Dims are independent: each device's
    shard is a box, one range per dim picked by the device's coordinates on that dim's axes."""
    old_split, new_split, old_cuts, new_cuts = before.split_axes, after.split_axes, before.dims_offsets, after.dims_offsets
    whole = 1
    product = None
    for d, size in enumerate(shape):
        # Indexed directly rather than through dim_axes / dim_offsets: this runs for every permute priced.
        old_axes = old_split[d] if d < len(old_split) else ()
        new_axes = new_split[d] if d < len(new_split) else ()
        old_offsets = old_cuts[d] if d < len(old_cuts) else ()
        new_offsets = new_cuts[d] if d < len(new_cuts) else ()
        if not (old_axes or new_axes or old_offsets or new_offsets):
            whole *= size
            continue
        rows = _dim_exchange(mesh, size, old_axes, old_offsets, new_axes, new_offsets)
        product = rows if product is None else product * rows
    return whole, product


def exchange_extent(mesh: Mesh, shape: tuple[int, ...], before: Sharding, after: Sharding) -> tuple[int, int]:
    """`missing_elements(...).max()` and `fan_in(...)` in one pass, without `_overlaps`' cache
    (a search prices each pair once)."""
    whole, product = _split_dims_product(mesh, shape, before, after)
    if product is None or whole == 0:
        return 0, 0  # every device already holds its whole new shard (or it is empty)
    new_volume, held, tiles = product
    # minimum(held, 1) is held > 0 (held is never negative) without a bool array to convert
    return whole * int((new_volume - held).max()), int((tiles - np.minimum(held, 1)).max())


def missing_elements(mesh: Mesh, shape: tuple[int, ...], before: Sharding, after: Sharding) -> np.ndarray:
    """Per device: elements of its new shard that its old shard does not hold."""
    new_volume, held, _ = _overlaps(mesh, shape, before, after)
    return new_volume - held


def exchange_axes(mesh: Mesh, rank: int, before: Sharding, after: Sharding) -> tuple[str, ...]:
    """Axes a direct exchange may cross: those of dims whose split changes, and axes whose role
    (split, partial, unused) changes. On every other axis sender and receiver agree."""
    changed = set()
    for d in range(rank):
        if before.dim_axes(d) != after.dim_axes(d) or dim_offsets(before, d) != dim_offsets(after, d):
            changed.update(before.dim_axes(d), after.dim_axes(d))
    changed.update(set(before.partial_axes) ^ set(after.partial_axes))
    return tuple(a for a in mesh.axis_names if a in changed)


def dim_offsets(sharding: Sharding, dim: int) -> tuple[int, ...]:
    return sharding.dims_offsets[dim] if dim < len(sharding.dims_offsets) else ()


def fan_in(mesh: Mesh, shape: tuple[int, ...], before: Sharding, after: Sharding) -> int:
    """The most peers any device receives a tile from in the direct exchange: its new shard
    cut along the old shards' bounds gives one tile per overlapping old shard, all but its own
    from another device."""
    _, held, tiles = _overlaps(mesh, shape, before, after)
    return int((tiles - (held > 0)).max())


@lru_cache(maxsize=256)
def device_transfers(mesh: Mesh, shape: tuple[int, ...], before: Sharding, after: Sharding,
               axes: tuple[str, ...]) -> tuple[Transfer, ...]:
    """Every device's new shard, cut along the old shards' bounds; each tile comes from the
    device itself when it holds it, else from the least-loaded holder that agrees with the
    receiver outside `axes` (and on every partial axis)."""
    old = {d: _box(_boxes(mesh, shape, before), i) for i, d in enumerate(mesh.devices())}
    new = {d: _box(_boxes(mesh, shape, after), i) for i, d in enumerate(mesh.devices())}
    fixed = [i for i, name in enumerate(mesh.axis_names) if name not in axes or name in before.partial_axes]
    holders: dict[tuple[Box, tuple[int, ...]], list[Device]] = {}
    for device in mesh.devices():
        holders.setdefault((old[device], tuple(device[i] for i in fixed)), []).append(device)
    bounds = [before.dim_bounds(mesh, size, d) for d, size in enumerate(shape)]
    sent: dict[Device, int] = {}
    transfers = []
    for target in mesh.devices():
        box = new[target]
        cuts = [[(s, e) for s, e in dim_bounds if max(s, a) < min(e, b)] for dim_bounds, (a, b) in zip(bounds, box)]
        for shard in itertools.product(*cuts):
            tile = tuple((max(s, a), min(e, b)) for (s, e), (a, b) in zip(shard, box))
            if old[target] == shard:
                source = target
            else:
                candidates = holders[(shard, tuple(target[i] for i in fixed))]
                source = min(candidates, key=lambda d: (sent.get(d, 0), sum(x != y for x, y in zip(d, target)),
                                                        mesh.linear_index(d)))
                sent[source] = sent.get(source, 0) + _volume(tile)
            transfers.append(Transfer(source, target, tuple((a - s, b - s) for (a, b), (s, _) in zip(tile, shard)),
                                      tuple((a - s, b - s) for (a, b), (s, _) in zip(tile, box))))
    return tuple(transfers)


def _inside(box: Box, shape: tuple[int, ...]) -> Box:
    return tuple((max(a, 0), min(b, size)) for (a, b), size in zip(box, shape))


def halo_received_elements(mesh: Mesh, shape: tuple[int, ...], before: Sharding, after: Sharding) -> np.ndarray:
    """Per device (linear order): the cells of its `after` box inside the tensor that its `before`
    box lacks, which an update_halo brings from the neighbours (padding is never sent)."""
    received = []
    for device in mesh.devices():
        new = _inside(after.device_box(mesh, shape, device), shape)
        old = before.device_box(mesh, shape, device)
        kept = tuple((max(a, c), min(b, d)) for (a, b), (c, d) in zip(new, old))
        received.append(_volume(tuple((a, max(a, b)) for a, b in new)) - _volume(tuple((a, max(a, b)) for a, b in kept)))
    return np.array(received, np.int64)


def received_elements(mesh: Mesh, shape: tuple[int, ...], step: CollectiveStep) -> dict[Device, float]:
    """Elements each device receives in `step`: the part of its new shard it did not hold, or
    for reductions the ring volume."""
    kind = step_kind(step.kind)
    if kind.name == "update_halo":
        return dict(zip(mesh.devices(), halo_received_elements(mesh, shape, step.before, step.after).astype(float)))
    if kind.reduces:
        factor = kind.ring_factor(mesh.group_size(step.mesh_axes))
        boxes = _boxes(mesh, shape, step.before)
        return dict(zip(mesh.devices(), factor * (boxes[..., 1] - boxes[..., 0]).prod(axis=1)))
    return dict(zip(mesh.devices(), missing_elements(mesh, shape, step.before, step.after).astype(float)))
