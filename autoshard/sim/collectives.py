"""Exact numpy semantics of the mesh collectives (MLIR `mesh` reference), on device contents.

Every function takes and returns `Shards` (device multi-index -> local tensor) and names mesh
axes by their names. Devices are grouped as in `Mesh.device_groups`: same coordinates outside
`mesh_axes`, in-group order induced by the order of `mesh_axes`. Roots, sources and destinations
are in-group multi-indices over `mesh_axes`.

Pieces follow the reference: a tensor dim of length `n` cut into `g` pieces gives piece `k` the
range `[k*ceil(n/g), (k+1)*ceil(n/g))` clipped to `n`, so the last pieces may be short or empty;
gathers concatenate the pieces actually held. A result the reference calls undefined (gather and
reduce off the root, shift without `rotate` where nothing arrives) is absent from the returned
dict: using it raises `UndefinedValueError`.
"""

from __future__ import annotations

import functools
from typing import Iterable, Mapping, Sequence

import numpy as np

from autoshard.errors import AutoshardError
from autoshard.mesh import Device, Mesh
from autoshard.reductions import REDUCTIONS
from autoshard.sharding import ceildiv

Shards = dict[Device, np.ndarray]
Box = tuple[tuple[int, int], ...]

class UndefinedValueError(AutoshardError):
    """A collective read a device whose value is undefined (or that holds none)."""


def split_bounds(length: int, count: int) -> list[tuple[int, int]]:
    """The reference's `count` pieces of a dim of `length`: ceildiv-sized, the last short."""
    step = ceildiv(length, count)
    return [(min(k * step, length), min((k + 1) * step, length)) for k in range(count)]


def _read(shards: Shards, device: Device, op: str) -> np.ndarray:
    try:
        return shards[device]
    except KeyError:
        raise UndefinedValueError(f"{op}: device {device} holds no defined value") from None


def _piece(array: np.ndarray, dim: int, count: int, index: int) -> np.ndarray:
    start, stop = split_bounds(array.shape[dim], count)[index]
    return array[(slice(None),) * dim + (slice(start, stop),)]


def _groups(mesh: Mesh, mesh_axes: Sequence[str]) -> list[list[Device]]:
    return mesh.device_groups(tuple(mesh_axes))


def _root(mesh: Mesh, group: list[Device], mesh_axes: Sequence[str], in_group: Sequence[int]) -> Device:
    key = mesh.group_key(group[0], mesh_axes)
    if len(in_group) != len(mesh_axes) or any(not 0 <= c < mesh.axis_size(a) for c, a in zip(in_group, mesh_axes)):
        raise ValueError(f"in-group device {list(in_group)} is not a multi-index over {list(mesh_axes)}")
    return mesh.device_in_group(key, mesh_axes, in_group)


def all_gather(shards: Shards, mesh: Mesh, mesh_axes: Sequence[str], gather_axis: int) -> Shards:
    out: Shards = {}
    for group in _groups(mesh, mesh_axes):
        whole = np.concatenate([_read(shards, d, "all_gather") for d in group], axis=gather_axis)
        out.update({d: whole for d in group})
    return out


def all_slice(shards: Shards, mesh: Mesh, mesh_axes: Sequence[str], slice_axis: int) -> Shards:
    count = mesh.group_size(mesh_axes)
    return {d: _piece(_read(shards, d, "all_slice"), slice_axis, count, mesh.in_group_linear(d, mesh_axes))
            for group in _groups(mesh, mesh_axes) for d in group}


def all_to_all(shards: Shards, mesh: Mesh, mesh_axes: Sequence[str], split_axis: int, concat_axis: int) -> Shards:
    """Piece `j` (along `split_axis`) of every group member goes to member `j`, which concatenates
    what it receives along `concat_axis` in in-group order."""
    out: Shards = {}
    for group in _groups(mesh, mesh_axes):
        inputs = [_read(shards, d, "all_to_all") for d in group]
        for j, device in enumerate(group):
            out[device] = np.concatenate([_piece(x, split_axis, len(group), j) for x in inputs], axis=concat_axis)
    return out


def _reduced(shards: Shards, group: list[Device], reduction: str, op: str) -> np.ndarray:
    return functools.reduce(REDUCTIONS[reduction].pairwise, (_read(shards, d, op) for d in group))


def all_reduce(shards: Shards, mesh: Mesh, mesh_axes: Sequence[str], reduction: str = "sum") -> Shards:
    out: Shards = {}
    for group in _groups(mesh, mesh_axes):
        total = _reduced(shards, group, reduction, "all_reduce")
        out.update({d: total for d in group})
    return out


def reduce_scatter(shards: Shards, mesh: Mesh, mesh_axes: Sequence[str], scatter_axis: int,
                   reduction: str = "sum") -> Shards:
    out: Shards = {}
    for group in _groups(mesh, mesh_axes):
        total = _reduced(shards, group, reduction, "reduce_scatter")
        out.update({d: _piece(total, scatter_axis, len(group), j) for j, d in enumerate(group)})
    return out


def broadcast(shards: Shards, mesh: Mesh, mesh_axes: Sequence[str], root: Sequence[int]) -> Shards:
    out: Shards = {}
    for group in _groups(mesh, mesh_axes):
        value = _read(shards, _root(mesh, group, mesh_axes, root), "broadcast")
        out.update({d: value for d in group})
    return out


def gather(shards: Shards, mesh: Mesh, mesh_axes: Sequence[str], gather_axis: int, root: Sequence[int]) -> Shards:
    return {_root(mesh, group, mesh_axes, root): np.concatenate([_read(shards, d, "gather") for d in group], axis=gather_axis)
            for group in _groups(mesh, mesh_axes)}


def reduce(shards: Shards, mesh: Mesh, mesh_axes: Sequence[str], root: Sequence[int], reduction: str = "sum") -> Shards:
    return {_root(mesh, group, mesh_axes, root): _reduced(shards, group, reduction, "reduce")
            for group in _groups(mesh, mesh_axes)}


def scatter(shards: Shards, mesh: Mesh, mesh_axes: Sequence[str], scatter_axis: int, root: Sequence[int]) -> Shards:
    out: Shards = {}
    for group in _groups(mesh, mesh_axes):
        value = _read(shards, _root(mesh, group, mesh_axes, root), "scatter")
        out.update({d: _piece(value, scatter_axis, len(group), j) for j, d in enumerate(group)})
    return out


def shift(shards: Shards, mesh: Mesh, mesh_axes: Sequence[str], shift_axis: str, offset: int,
          rotate: bool = False) -> Shards:
    """Data moves `offset` places up along `shift_axis`: the device at coordinate `c` receives
    from `c - offset` (modulo the axis size with `rotate`; else nothing arrives out of range)."""
    if shift_axis not in mesh_axes:
        raise ValueError(f"shift_axis {shift_axis!r} must be one of mesh_axes {list(mesh_axes)}")
    axis, size = mesh.axis_index(shift_axis), mesh.axis_size(shift_axis)
    out: Shards = {}
    for device in mesh.devices():
        source = device[axis] - offset
        if rotate:
            source %= size
        elif not 0 <= source < size:
            continue
        out[device] = _read(shards, device[:axis] + (source,) + device[axis + 1:], "shift")
    return out


def send_recv(shards: Shards, mesh: Mesh, mesh_axes: Sequence[str], source: Sequence[int],
              destination: Sequence[int]) -> Shards:
    """In every group the in-group device `source` sends its tensor to `destination`, whose
    receive buffer it replaces; every other device keeps its value."""
    out = dict(shards)
    for group in _groups(mesh, mesh_axes):
        out[_root(mesh, group, mesh_axes, destination)] = _read(shards, _root(mesh, group, mesh_axes, source), "send")
    return out


def permute(shards: Shards, transfers: Iterable[tuple[Device, Device, Box, Box]],
            out_shapes: Mapping[Device, tuple[int, ...]]) -> Shards:
    """General point-to-point exchange: each transfer `(source, target, source_box, target_box)`
    copies `source`'s local box into `target`'s new buffer (boxes are per-dim `(start, stop)` in
    local coordinates; a source may equal its target). Every element of every new buffer must be
    written exactly once."""
    dtype = next(iter(shards.values())).dtype
    out = {d: np.zeros(shape, dtype) for d, shape in out_shapes.items()}
    written = {d: np.zeros(shape, np.int8) for d, shape in out_shapes.items()}
    for source, target, source_box, target_box in transfers:
        src = tuple(slice(a, b) for a, b in source_box)
        dst = tuple(slice(a, b) for a, b in target_box)
        out[target][dst] = _read(shards, source, "permute")[src]
        written[target][dst] += 1
    for device, counts in written.items():
        if counts.size and (counts.min() != 1 or counts.max() != 1):
            raise UndefinedValueError(f"permute: the new buffer of device {device} is not written exactly once everywhere")
    return out
