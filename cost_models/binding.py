"""Binding a logical mesh to a machine: which physical dims each mesh axis runs over.

Devices are numbered row-major on both sides, so a mesh binds when its axes are a reshape of
the machine's dims. By default the innermost (last) mesh axis takes the innermost, fastest dims:
`dp=4,tp=8` on 4 DGX nodes puts `tp` on the 8 GPUs of a node (NVLink) and `dp` across nodes
(NICs); `a=4,b=16` on a 4x4x4 slice puts `b` over the `y` and `z` torus dims. An axis smaller than
a dim takes a contiguous part of it and the next axis the rest, strided. An explicit mapping names
the physical dims of each axis instead (`{"dp": ["node"], "tp": ["gpu"]}`); axes naming the same
dim split it in mesh order, the later axis inner.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from cost_models.errors import BindingError
from cost_models.machine import Machine


@dataclass(frozen=True, slots=True)
class Segment:
    """Part of one physical dim used by a mesh axis: `factor` positions, `stride` apart."""

    dim: int  # index into Machine.dims
    factor: int
    stride: int


Segments = dict[str, tuple[Segment, ...]]


def default_segments(machine: Machine, axis_names: Sequence[str], axis_sizes: Sequence[int]) -> Segments:
    """Inner mesh axes on inner physical dims, as a row-major reshape."""
    dims = machine.dims
    taken: dict[str, list[Segment]] = {name: [] for name in axis_names}
    d, used = len(dims) - 1, 1  # current physical dim (from the inside) and how much of it is taken
    for name, size in zip(reversed(axis_names), reversed(axis_sizes)):
        need = size
        while need > 1:
            while d >= 0 and used == dims[d].size:
                d, used = d - 1, 1
            left = dims[d].size // used
            if need % left == 0:
                taken[name].append(Segment(d, left, used))
                need, used = need // left, dims[d].size
            elif left % need == 0:
                taken[name].append(Segment(d, need, used))
                need, used = 1, used * need
            else:
                raise BindingError(f"mesh.{name}", f"axis of size {size} does not factor into "
                                                   f"{machine.describe()}: {dims[d].name} has {left} positions left")
    return {name: tuple(reversed(segments)) for name, segments in taken.items()}


def _dim_names(value: Any, axis: str) -> list[str]:
    if isinstance(value, str):
        names = [part.strip() for part in value.replace("+", ",").split(",")]
    elif isinstance(value, Sequence) and all(isinstance(v, str) for v in value):
        names = list(value)
    else:
        raise BindingError(f"mapping.{axis}", f"expected physical dim names like ['node'] or 'y+z', got {value!r}")
    if not names or any(not n for n in names) or len(set(names)) != len(names):
        raise BindingError(f"mapping.{axis}", f"expected distinct physical dim names, got {value!r}")
    return names


def mapped_segments(machine: Machine, axis_names: Sequence[str], axis_sizes: Sequence[int],
                    mapping: Mapping[str, Any]) -> Segments:
    """Segments from an explicit mapping of mesh axes to physical dim names."""
    sizes = dict(zip(axis_names, axis_sizes))
    index = {dim.name: i for i, dim in enumerate(machine.dims)}
    for axis in mapping:
        if axis not in sizes:
            raise BindingError(f"mapping.{axis}", f"not a mesh axis; the mesh has {list(axis_names)}")
    dims_of: dict[str, list[int]] = {}
    for axis in axis_names:
        if axis not in mapping:
            if sizes[axis] > 1:
                raise BindingError(f"mapping.{axis}", "mesh axis is not mapped to any physical dim")
            dims_of[axis] = []
            continue
        names = _dim_names(mapping[axis], axis)
        unknown = [n for n in names if n not in index]
        if unknown:
            raise BindingError(f"mapping.{axis}", f"unknown physical dim {unknown[0]!r}; {machine.describe()} has "
                                                  f"{[(d.name, d.size) for d in machine.dims]}")
        dims_of[axis] = [index[n] for n in names]
    users = {i: [a for a in axis_names if i in dims_of[a]] for i in range(len(machine.dims))}
    for i, axes in users.items():
        if not axes:
            raise BindingError("mapping", f"physical dim {machine.dims[i].name} is not used by any mesh axis")
    factors: dict[tuple[str, int], int] = {}
    for axis in axis_names:
        shared = [i for i in dims_of[axis] if len(users[i]) > 1]
        whole = math.prod(machine.dims[i].size for i in dims_of[axis] if i not in shared)
        if len(shared) > 1:
            raise BindingError(f"mapping.{axis}", "an axis may share at most one physical dim with other axes")
        if sizes[axis] % whole or (not shared and sizes[axis] != whole):
            raise BindingError(f"mapping.{axis}", f"axis size {sizes[axis]} does not match its physical dims "
                                                  f"{[machine.dims[i].name for i in dims_of[axis]]} (size {whole})")
        for i in dims_of[axis]:
            factors[axis, i] = sizes[axis] // whole if i in shared else machine.dims[i].size
    strides: dict[tuple[str, int], int] = {}
    for i, axes in users.items():
        stride = 1
        for axis in reversed(axes):  # later mesh axes are inner
            strides[axis, i] = stride
            stride *= factors[axis, i]
        if stride != machine.dims[i].size:
            raise BindingError("mapping", f"axes {axes} split physical dim {machine.dims[i].name} of size "
                                          f"{machine.dims[i].size} into {stride} positions")
    return {axis: tuple(Segment(i, factors[axis, i], strides[axis, i]) for i in dims_of[axis]) for axis in axis_names}


def unsplit_count(machine: Machine, segments: Segments) -> int:
    """How many segments cover only part of their dim (fewer is a cleaner placement)."""
    return sum(1 for segs in segments.values() for s in segs if s.factor != machine.dims[s.dim].size)
