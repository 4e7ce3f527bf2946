"""Shardings of a tensor on a mesh, as in the MLIR `mesh` dialect.

A sharding lists, for each tensor dim, the mesh axes it is split over (first axis major), and
optionally mesh axes over which the value is *partial* (to be combined with a reduction kind).
Shard `k` of a dim of size `n` split `p` ways covers `[k*ceil(n/p), min((k+1)*ceil(n/p), n))`:
the last shards may be short or even empty. Explicit `sharded_dims_offsets` override that.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Sequence

from autoshard.errors import Problem, ShardingError
from autoshard.mesh import Device, Mesh
from autoshard.reductions import REDUCTION_KINDS


def ceildiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True, slots=True)
class Sharding:
    """`split_axes[d]` are the mesh axes splitting dim `d`; trailing unsplit dims are dropped."""

    split_axes: tuple[tuple[str, ...], ...] = ()
    partial_axes: tuple[str, ...] = ()
    partial_kind: str = "sum"
    # For each dim: () for the default ceildiv split, else the shard starts plus the end.
    dims_offsets: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        split = tuple(tuple(axes) for axes in self.split_axes)
        offsets = tuple(tuple(o) for o in self.dims_offsets)
        while split and not split[-1] and (len(offsets) < len(split) or not offsets[len(split) - 1]):
            split = split[:-1]
        offsets = offsets[: len(split)]
        while offsets and not offsets[-1]:
            offsets = offsets[:-1]
        object.__setattr__(self, "split_axes", split)
        object.__setattr__(self, "dims_offsets", offsets)
        object.__setattr__(self, "partial_axes", tuple(self.partial_axes))
        if self.partial_kind not in REDUCTION_KINDS:
            raise ShardingError(f"partial kind must be one of {list(REDUCTION_KINDS)}, got {self.partial_kind!r}", "partial/kind")

    # --- construction -------------------------------------------------------------------
    @classmethod
    def replicated(cls) -> "Sharding":
        return cls()

    @classmethod
    def parse(cls, value: Any) -> "Sharding":
        """Accept the JSON object form, its `split_axes` list alone, or the short text `[[x],[y]]`."""
        if isinstance(value, Sharding):
            return value
        if isinstance(value, str):
            text = value.strip()
            try:
                value = json.loads(text)
            except json.JSONDecodeError:
                quoted = re.sub(r"([A-Za-z_][A-Za-z0-9_]*)", r'"\1"', text)
                try:
                    value = json.loads(quoted)
                except json.JSONDecodeError:
                    raise ShardingError(f"cannot read sharding {text!r}; expected e.g. [[x],[y]] or a JSON object") from None
        if isinstance(value, list):
            value = {"split_axes": value}
        if not isinstance(value, dict):
            raise ShardingError(f"expected a sharding object or list, got {type(value).__name__}")
        split = value.get("split_axes", [])
        if not isinstance(split, list) or not all(isinstance(d, list) and all(isinstance(a, str) for a in d) for d in split):
            raise ShardingError("split_axes must be a list of lists of mesh axis names", "split_axes")
        partial = value.get("partial") or {}
        if not isinstance(partial, dict):
            raise ShardingError('partial must be {"kind": ..., "axes": [...]}', "partial")
        axes = partial.get("axes", [])
        if not isinstance(axes, list) or not all(isinstance(a, str) for a in axes):
            raise ShardingError("partial axes must be a list of mesh axis names", "partial/axes")
        offsets = value.get("sharded_dims_offsets", [])
        if not isinstance(offsets, list) or not all(
                isinstance(d, list) and all(isinstance(o, int) and not isinstance(o, bool) for o in d) for d in offsets):
            raise ShardingError("sharded_dims_offsets must be a list of integer lists, one per dim",
                                "sharded_dims_offsets")
        return cls(tuple(tuple(d) for d in split), tuple(axes), partial.get("kind", "sum"), tuple(tuple(o) for o in offsets))

    # --- queries ------------------------------------------------------------------------
    def dim_axes(self, dim: int) -> tuple[str, ...]:
        return self.split_axes[dim] if dim < len(self.split_axes) else ()

    def used_axes(self) -> tuple[str, ...]:
        return tuple(a for axes in self.split_axes for a in axes) + self.partial_axes

    @property
    def is_partial(self) -> bool:
        return bool(self.partial_axes)

    def without_partial(self) -> "Sharding":
        return Sharding(self.split_axes, (), "sum", self.dims_offsets)

    def with_split(self, split_axes: Sequence[Sequence[str]]) -> "Sharding":
        """The same partial axes and explicit offsets over new split axes (`check` tells whether
        the offsets still fit the new split)."""
        return Sharding(tuple(tuple(a) for a in split_axes), self.partial_axes, self.partial_kind, self.dims_offsets)

    def check(self, mesh: Mesh, shape: Sequence[int], where: str = "") -> None:
        """Raise a ShardingError naming every problem of this sharding for `shape` on `mesh`."""
        problems: list[Problem] = []
        if len(self.split_axes) > len(shape):
            problems.append(Problem(where, f"split_axes has {len(self.split_axes)} entries but the tensor has rank {len(shape)}"))
        seen: set[str] = set()
        for axis in self.used_axes():
            if axis not in mesh.axis_names:
                problems.append(Problem(where, f"unknown mesh axis {axis!r}; the mesh has {list(mesh.axis_names)}"))
            elif axis in seen:
                problems.append(Problem(where, f"mesh axis {axis!r} is used twice in one sharding"))
            seen.add(axis)
        for dim, offsets in enumerate(self.dims_offsets):
            if not offsets or problems:
                continue
            count = mesh.group_size(self.dim_axes(dim))
            if (len(offsets) != count + 1 or offsets[0] != 0 or offsets[-1] != shape[dim]
                    or any(b < a for a, b in zip(offsets, offsets[1:]))):
                problems.append(Problem(where, f"sharded_dims_offsets of dim {dim} must rise from 0 to {shape[dim]} in {count + 1} values"))
        if problems:
            raise ShardingError(problems)

    def shard_count(self, mesh: Mesh, dim: int) -> int:
        return mesh.group_size(self.dim_axes(dim))

    def same_layout(self, other: "Sharding", mesh: Mesh, shape: Sequence[int]) -> bool:
        """Equal device contents: every dim split by the same axes at the same bounds (offsets
        that spell out the even split equal none), the same partial axes in any order and, where
        something is partial, the same kind."""
        if set(self.partial_axes) != set(other.partial_axes):
            return False
        if self.partial_axes and self.partial_kind != other.partial_kind:
            return False
        return all(self.dim_axes(d) == other.dim_axes(d) and self.dim_bounds(mesh, size, d) == other.dim_bounds(mesh, size, d)
                   for d, size in enumerate(shape))

    def dim_bounds(self, mesh: Mesh, size: int, dim: int) -> list[tuple[int, int]]:
        """(start, stop) of every shard of `dim`, in shard order."""
        if dim < len(self.dims_offsets) and self.dims_offsets[dim]:
            offs = self.dims_offsets[dim]
            return list(zip(offs, offs[1:]))
        count = self.shard_count(mesh, dim)
        step = ceildiv(size, count)
        return [(min(k * step, size), min((k + 1) * step, size)) for k in range(count)]

    def device_slices(self, mesh: Mesh, shape: Sequence[int], device: Device) -> tuple[slice, ...]:
        """The global index range each dim of `device`'s shard covers."""
        slices = []
        for dim, size in enumerate(shape):
            shard = mesh.in_group_linear(device, self.dim_axes(dim))
            start, stop = self.dim_bounds(mesh, size, dim)[shard]
            slices.append(slice(start, stop))
        return tuple(slices)

    def local_shape(self, mesh: Mesh, shape: Sequence[int], device: Device) -> tuple[int, ...]:
        return tuple(s.stop - s.start for s in self.device_slices(mesh, shape, device))

    def max_local_shape(self, mesh: Mesh, shape: Sequence[int]) -> tuple[int, ...]:
        """The largest shard per dim: the buffer every device allocates."""
        return tuple(max(b - a for a, b in self.dim_bounds(mesh, size, dim)) for dim, size in enumerate(shape))

    # --- printing -----------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"split_axes": [list(a) for a in self.split_axes]}
        if self.partial_axes:
            out["partial"] = {"kind": self.partial_kind, "axes": list(self.partial_axes)}
        if self.dims_offsets:
            out["sharded_dims_offsets"] = [list(o) for o in self.dims_offsets]
        return out

    def __str__(self) -> str:
        text = "[" + ", ".join("[" + ", ".join(a) + "]" for a in self.split_axes) + "]"
        if self.partial_axes:
            text += f" partial={self.partial_kind}[" + ", ".join(self.partial_axes) + "]"
        return text
