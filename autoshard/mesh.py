"""Logical device meshes, device groups and in-group indices.

Semantics follow the MLIR `mesh` dialect reference: devices are multi-indices over the mesh
axes (row-major, first axis outermost). A list of mesh axes partitions the devices into groups:
devices that agree on every coordinate *outside* the list share a group, and the order inside a
group is induced by the list order, outer to inner.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from typing import Iterator, Sequence

from autoshard.errors import InputError, Problem
from autoshard.numerals import parse_integer

Device = tuple[int, ...]

_AXIS_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# The most devices a mesh may have: beyond the largest machines built (tens of thousands of chips),
# and small enough that nothing sized per device can stall a request.
MAX_DEVICES = 2 ** 20


@dataclass(frozen=True, slots=True)
class Mesh:
    """Named axes with sizes, in the order given (axis `i` is index `i` in MLIR)."""

    axis_names: tuple[str, ...]
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        problems = []
        if len(self.axis_names) != len(self.shape):
            problems.append(Problem("mesh", "needs one size per axis name"))
        if not self.axis_names:
            problems.append(Problem("mesh", "needs at least one axis"))
        seen: set[str] = set()
        for name, size in zip(self.axis_names, self.shape):
            if not isinstance(name, str) or not _AXIS_NAME.match(name):
                problems.append(Problem(f"mesh/{name}", "axis name must be an identifier"))
            if name in seen:
                problems.append(Problem(f"mesh/{name}", "axis name is used twice"))
            seen.add(name)
            if not isinstance(size, int) or isinstance(size, bool) or size < 1:
                problems.append(Problem(f"mesh/{name}", f"axis size must be a positive integer, got {size!r}"))
        if not problems and math.prod(self.shape) > MAX_DEVICES:
            problems.append(Problem("mesh", f"{math.prod(self.shape)} devices, over the limit of {MAX_DEVICES} "
                                            f"(2**20); a mesh that large is beyond any machine"))
        if problems:
            raise InputError(problems)

    @classmethod
    def of(cls, **axes: int) -> "Mesh":
        return cls(tuple(axes), tuple(axes.values()))

    @classmethod
    def parse(cls, text: str) -> "Mesh":
        """Parse `dp=2,tp=4` (the CLI and REST spelling)."""
        names, sizes = [], []
        for part in text.split(","):
            name, sep, size = part.strip().partition("=")
            if not sep:
                raise InputError(f"expected NAME=SIZE[,NAME=SIZE...], e.g. dp=2,tp=4; got {text!r}", "mesh")
            names.append(name.strip())
            sizes.append(parse_integer(size, f"mesh/{name.strip()}"))
        return cls(tuple(names), tuple(sizes))

    def __str__(self) -> str:
        return ",".join(f"{n}={s}" for n, s in zip(self.axis_names, self.shape))

    @property
    def num_devices(self) -> int:
        return math.prod(self.shape)

    def axis_index(self, name: str) -> int:
        try:
            return self.axis_names.index(name)
        except ValueError:
            raise InputError(f"unknown mesh axis {name!r}; the mesh has {list(self.axis_names)}", "mesh") from None

    def axis_size(self, name: str) -> int:
        return self.shape[self.axis_index(name)]

    def group_size(self, axes: Sequence[str]) -> int:
        return math.prod(self.axis_size(a) for a in axes)

    def devices(self) -> Iterator[Device]:
        """Every device's multi-index, in linear (row-major) order."""
        return itertools.product(*(range(s) for s in self.shape))

    def linear_index(self, device: Device) -> int:
        index = 0
        for coord, size in zip(device, self.shape):
            index = index * size + coord
        return index

    def in_group_index(self, device: Device, axes: Sequence[str]) -> tuple[int, ...]:
        """The device's multi-index over `axes` (the in-group device of the reference)."""
        return tuple(device[self.axis_index(a)] for a in axes)

    def in_group_linear(self, device: Device, axes: Sequence[str]) -> int:
        """Position of the device inside its group: its coordinates over `axes`, first axis major."""
        position = 0
        for axis in axes:
            position = position * self.axis_size(axis) + device[self.axis_index(axis)]
        return position

    def group_key(self, device: Device, axes: Sequence[str]) -> tuple[int, ...]:
        """Identifies the device's group: its coordinates on the axes *not* in `axes`."""
        inside = {self.axis_index(a) for a in axes}
        return tuple(c for i, c in enumerate(device) if i not in inside)

    def device_in_group(self, key: tuple[int, ...], axes: Sequence[str], in_group: Sequence[int]) -> Device:
        """The device of group `key` whose in-group multi-index over `axes` is `in_group`."""
        inside = {self.axis_index(a): c for a, c in zip(axes, in_group)}
        outside = iter(key)
        return tuple(inside[i] if i in inside else next(outside) for i in range(len(self.shape)))

    def device_groups(self, axes: Sequence[str]) -> list[list[Device]]:
        """All groups for `axes`, groups in order of their key, devices in in-group order."""
        outside = [i for i, n in enumerate(self.axis_names) if n not in axes]
        keys = itertools.product(*(range(self.shape[i]) for i in outside))
        in_group = list(itertools.product(*(range(self.axis_size(a)) for a in axes)))
        return [[self.device_in_group(key, axes, idx) for idx in in_group] for key in keys]

    def to_mlir_shape(self) -> str:
        return "x".join(str(s) for s in self.shape)
