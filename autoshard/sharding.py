"""Shardings of a tensor on a mesh, as in the MLIR `mesh` dialect.

A sharding lists, for each tensor dim, the mesh axes it is split over (first axis major), and
optionally mesh axes over which the value is *partial* (to be combined with a reduction kind).
Shard `k` of a dim of size `n` split `p` ways covers `[k*ceil(n/p), min((k+1)*ceil(n/p), n))`:
the last shards may be short or even empty. Explicit `sharded_dims_offsets` override that.

`halo_sizes` (exclusive with offsets) widen every shard of a split dim by `start` cells before its
block and `end` cells after it: each device then holds `ceil(n/p) + start + end` cells of that dim,
the same on every device, and the cells of that box that fall outside the tensor are padding.
"""

from __future__ import annotations

import difflib
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
    # For each dim: the (start, end) halo cells around every shard; (0, 0) where there is none.
    halo_sizes: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        split = tuple(tuple(axes) for axes in self.split_axes)
        offsets = tuple(tuple(o) for o in self.dims_offsets)
        halos = tuple(tuple(h) for h in self.halo_sizes)
        while split and not split[-1] and (len(offsets) < len(split) or not offsets[len(split) - 1]):
            split = split[:-1]
        offsets = offsets[: len(split)]
        while offsets and not offsets[-1]:
            offsets = offsets[:-1]
        while halos and tuple(halos[-1]) == (0, 0):
            halos = halos[:-1]
        object.__setattr__(self, "split_axes", split)
        object.__setattr__(self, "dims_offsets", offsets)
        object.__setattr__(self, "halo_sizes", halos)
        object.__setattr__(self, "partial_axes", tuple(self.partial_axes))
        if self.partial_kind not in REDUCTION_KINDS:
            raise ShardingError(f"partial kind must be one of {list(REDUCTION_KINDS)}, got {self.partial_kind!r}", "partial/kind")
        self._check_halos()

    def _check_halos(self) -> None:
        for dim, halo in enumerate(self.halo_sizes):
            if len(halo) != 2 or not all(isinstance(h, int) and not isinstance(h, bool) and h >= 0 for h in halo):
                raise ShardingError(f"halo_sizes of dim {dim} must be two non-negative integers (start, end), got {list(halo)}",
                                    "halo_sizes")
            if halo != (0, 0) and not self.dim_axes(dim):
                raise ShardingError(f"dim {dim} has a halo {list(halo)} but is not split", "halo_sizes")
        if self.halo_sizes and self.dims_offsets:
            raise ShardingError("halo_sizes and sharded_dims_offsets are mutually exclusive", "halo_sizes")

    # --- construction -------------------------------------------------------------------
    @classmethod
    def replicated(cls) -> "Sharding":
        return cls()

    @classmethod
    def parse(cls, value: Any, rank: int | None = None) -> "Sharding":
        """Accept the JSON object form, its `split_axes` list alone, or the short text `[[x],[y]]`.
        With `rank`, the sharding is of a tensor of that many dims: more entries per dim are refused
        (trailing unsplit ones would otherwise be dropped without a word)."""
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
        _refuse_unknown_keys(value, _KEYS, "")
        split = value.get("split_axes", [])
        if not isinstance(split, list) or not all(isinstance(d, list) and all(isinstance(a, str) for a in d) for d in split):
            raise ShardingError("split_axes must be a list of lists of mesh axis names", "split_axes")
        partial = value.get("partial") or {}
        if not isinstance(partial, dict):
            raise ShardingError('partial must be {"kind": ..., "axes": [...]}', "partial")
        _refuse_unknown_keys(partial, _PARTIAL_KEYS, "partial/")
        axes = partial.get("axes", [])
        if not isinstance(axes, list) or not all(isinstance(a, str) for a in axes):
            raise ShardingError("partial axes must be a list of mesh axis names", "partial/axes")
        if value.get("partial") is not None and not axes:  # else read as not partial, whatever the kind says
            raise ShardingError("a partial value needs at least one mesh axis; leave partial out for a value "
                                "that is not partial", "partial/axes")
        offsets = value.get("sharded_dims_offsets", [])
        if not isinstance(offsets, list) or not all(
                isinstance(d, list) and all(isinstance(o, int) and not isinstance(o, bool) for o in d) for d in offsets):
            raise ShardingError("sharded_dims_offsets must be a list of integer lists, one per dim",
                                "sharded_dims_offsets")
        halos = halos_from_flat(value.get("halo_sizes", []), split)
        sharding = cls(tuple(tuple(d) for d in split), tuple(axes), partial.get("kind", "sum"),
                       tuple(tuple(o) for o in offsets), halos)
        # entries past the rank that construction dropped (unsplit ones); any others `check` reports
        for key, given, kept in (("split_axes", split, sharding.split_axes),
                                 ("sharded_dims_offsets", offsets, sharding.dims_offsets)):
            if rank is not None and len(given) > rank >= len(kept):
                raise ShardingError(f"{key} has {len(given)} entries but the tensor has rank {rank}")
        return sharding

    # --- queries ------------------------------------------------------------------------
    def dim_axes(self, dim: int) -> tuple[str, ...]:
        return self.split_axes[dim] if dim < len(self.split_axes) else ()

    def halo(self, dim: int) -> tuple[int, int]:
        """(start, end) halo cells of `dim`'s shards; (0, 0) without a halo."""
        return self.halo_sizes[dim] if dim < len(self.halo_sizes) else (0, 0)

    @property
    def has_halo(self) -> bool:
        return bool(self.halo_sizes)

    def without_halo(self) -> Sharding:
        return Sharding(self.split_axes, self.partial_axes, self.partial_kind, self.dims_offsets)

    def with_halo(self, halo_sizes: Sequence[tuple[int, int]]) -> Sharding:
        return Sharding(self.split_axes, self.partial_axes, self.partial_kind, self.dims_offsets, tuple(halo_sizes))

    def flat_halo_sizes(self) -> list[int]:
        """The IR's and JSON's spelling: (start, end) of every split dim, in dim order."""
        return [h for dim, axes in enumerate(self.split_axes) if axes for h in self.halo(dim)]

    def used_axes(self) -> tuple[str, ...]:
        return tuple(a for axes in self.split_axes for a in axes) + self.partial_axes

    @property
    def is_partial(self) -> bool:
        return bool(self.partial_axes)

    def without_partial(self) -> "Sharding":
        return Sharding(self.split_axes, (), "sum", self.dims_offsets, self.halo_sizes)

    def with_split(self, split_axes: Sequence[Sequence[str]]) -> "Sharding":
        """The same partial axes and explicit offsets over new split axes (`check` tells whether
        the offsets still fit the new split); halos, tied to the old split, are dropped."""
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
        for dim, halo in enumerate(self.halo_sizes):
            if problems or dim >= len(shape):
                continue
            block = ceildiv(shape[dim], self.shard_count(mesh, dim))
            if max(halo) > block:
                # update_halo exchanges with the adjacent shards only.
                problems.append(Problem(where, f"halo_sizes of dim {dim} ({list(halo)}) exceed the shard of {block} cells: "
                                               f"a halo may reach only into the neighbouring shards"))
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
        if self.halo_sizes != other.halo_sizes:
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
        """The global index range each dim of `device`'s block covers (the cells it owns; halos excluded)."""
        slices = []
        for dim, size in enumerate(shape):
            shard = mesh.in_group_linear(device, self.dim_axes(dim))
            start, stop = self.dim_bounds(mesh, size, dim)[shard]
            slices.append(slice(start, stop))
        return tuple(slices)

    def device_box(self, mesh: Mesh, shape: Sequence[int], device: Device) -> tuple[tuple[int, int], ...]:
        """The global (start, stop) each dim of `device`'s local tensor spans, halos included. On a
        haloed dim the box is `[k*b - start, (k+1)*b + end)` with `b = ceil(n/p)`, the same length on
        every device, and may reach outside `[0, n)` (those cells are padding)."""
        box = []
        for dim, size in enumerate(shape):
            shard = mesh.in_group_linear(device, self.dim_axes(dim))
            start, stop = self.dim_bounds(mesh, size, dim)[shard]
            before, after = self.halo(dim)
            if before or after:
                block = ceildiv(size, self.shard_count(mesh, dim))
                start, stop = shard * block, (shard + 1) * block
            box.append((start - before, stop + after))
        return tuple(box)

    def local_shape(self, mesh: Mesh, shape: Sequence[int], device: Device) -> tuple[int, ...]:
        """`device`'s local tensor: its block, plus both halos on haloed dims."""
        return tuple(stop - start for start, stop in self.device_box(mesh, shape, device))

    def max_local_shape(self, mesh: Mesh, shape: Sequence[int]) -> tuple[int, ...]:
        """The largest shard per dim, halos included: the buffer every device allocates."""
        return tuple(self._largest_shard(mesh, size, dim) + sum(self.halo(dim)) for dim, size in enumerate(shape))

    def _largest_shard(self, mesh: Mesh, size: int, dim: int) -> int:
        if dim < len(self.dims_offsets) and self.dims_offsets[dim]:
            return max(b - a for a, b in self.dim_bounds(mesh, size, dim))
        return min(ceildiv(size, self.shard_count(mesh, dim)), size)  # the first of `dim_bounds`' even shards

    # --- printing -----------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"split_axes": [list(a) for a in self.split_axes]}
        if self.partial_axes:
            out["partial"] = {"kind": self.partial_kind, "axes": list(self.partial_axes)}
        if self.dims_offsets:
            out["sharded_dims_offsets"] = [list(o) for o in self.dims_offsets]
        if self.halo_sizes:
            out["halo_sizes"] = self.flat_halo_sizes()
        return out

    def __str__(self) -> str:
        text = "[" + ", ".join("[" + ", ".join(a) + "]" for a in self.split_axes) + "]"
        if self.partial_axes:
            text += f" partial={self.partial_kind}[" + ", ".join(self.partial_axes) + "]"
        if self.halo_sizes:
            text += " halo_sizes=[" + ", ".join(str(h) for h in self.flat_halo_sizes()) + "]"
        return text


_KEYS = ("split_axes", "partial", "sharded_dims_offsets", "halo_sizes")
_PARTIAL_KEYS = ("kind", "axes")


def _refuse_unknown_keys(value: dict[str, Any], known: tuple[str, ...], prefix: str) -> None:
    """A misspelled key (`split_axis`, `halo`) would leave its dims replicated without a word."""
    problems = []
    for key in value:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.5)
            hint = f"did you mean {close[0]!r}? " if close else ""
            owner = "partial" if prefix else "a sharding"
            problems.append(Problem(f"{prefix}{key}", f"unknown key; {hint}{owner} has {', '.join(known)}"))
    if problems:
        raise ShardingError(problems)


def halos_from_flat(flat: Any, split_axes: Sequence[Sequence[str]]) -> tuple[tuple[int, int], ...]:
    """The JSON/IR `halo_sizes` (two values per split dim, in dim order) as one pair per dim."""
    if not isinstance(flat, list) or not all(isinstance(h, int) and not isinstance(h, bool) and h >= 0 for h in flat):
        raise ShardingError("halo_sizes must be a list of non-negative integers, two (start, end) per split dim",
                            "halo_sizes")
    split_dims = [dim for dim, axes in enumerate(split_axes) if axes]
    if flat and len(flat) != 2 * len(split_dims):
        raise ShardingError(f"halo_sizes needs two values (start, end) for each of the {len(split_dims)} split dims, "
                            f"{2 * len(split_dims)} in all; got {len(flat)}", "halo_sizes")
    halos = [(0, 0)] * len(split_axes)
    for index, dim in enumerate(split_dims if flat else ()):
        halos[dim] = (flat[2 * index], flat[2 * index + 1])
    return tuple(halos)
