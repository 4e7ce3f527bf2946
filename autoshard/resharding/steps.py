"""The steps of a resharding and what they cost: `Transfer`, `CollectiveStep`, `Resharding`,
the `Price` a caller gives the planner, and `BytesMovedPrice`, a price without a hardware profile.

`STEP_KINDS` is the table of the collectives a resharding step may be (see README.md for their
effects): one `StepKind` row each, with the facts the planner, its prices, the IR printer and
the simulator share. Readers that live in later packages (the simulator's `STEP_RUNNERS`, the
printer's `STEP_PRINTERS`) key their own dicts by these names; a test holds them to this table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, NamedTuple

from autoshard.mesh import Device, Mesh
from autoshard.sharding import Sharding


Price = Callable[[str, tuple[str, ...], float], float]
Box = tuple[tuple[int, int], ...]



@dataclass(frozen=True, slots=True)
class StepKind:
    name: str
    attrs: tuple[str, ...]  # the keys of `CollectiveStep.dims`, in the order the IR prints them
    cut: str | None  # the attribute naming the tensor dim cut into one piece per group member
    padded: bool  # priced on the input buffer padded to equal chunks per peer along `cut`
    moves_data: bool  # False: every device keeps part of what it holds, nothing is sent
    price_kind: str  # the collective `price` is asked about (a permute: point-to-point traffic)
    ring_factor: Callable[[int], float]  # bytes a device receives per byte priced, in a ring of g devices

    @property
    def reduces(self) -> bool:
        return "reduction" in self.attrs

    @property
    def dim_attrs(self) -> tuple[str, ...]:
        """The attributes that name a tensor dim."""
        return tuple(a for a in self.attrs if a.endswith("_axis"))


STEP_KINDS: dict[str, StepKind] = {k.name: k for k in (
    StepKind("all_gather", ("gather_axis",), None, False, True, "all_gather", lambda g: g - 1),
    StepKind("all_slice", ("slice_axis",), "slice_axis", False, False, "all_slice", lambda g: 0.0),
    StepKind("all_to_all", ("split_axis", "concat_axis"), "split_axis", True, True, "all_to_all", lambda g: (g - 1) / g),
    StepKind("all_reduce", ("reduction",), None, False, True, "all_reduce", lambda g: 2 * (g - 1) / g),
    StepKind("reduce_scatter", ("reduction", "scatter_axis"), "scatter_axis", True, True, "reduce_scatter",
             lambda g: (g - 1) / g),
    StepKind("permute", ("transfers",), None, False, True, "send_recv", lambda g: 1.0),
    # Each device receives its halo cells from its neighbours: point-to-point traffic, as a permute.
    StepKind("update_halo", ("source_halo_sizes", "destination_halo_sizes"), None, False, True, "send_recv",
             lambda g: 1.0),
)}
# permute and update_halo share the send_recv row (and its ring factor).
_BY_PRICE_KIND = {k.price_kind: k for k in STEP_KINDS.values()}


def step_kind(name: str) -> StepKind:
    """The row of step kind `name`; the one place an unknown kind is refused."""
    try:
        return STEP_KINDS[name]
    except KeyError:
        raise ValueError(f"unknown resharding step kind {name!r}; expected one of {list(STEP_KINDS)}") from None


class Transfer(NamedTuple):
    """`target`'s new local `target_box` is `source`'s old local `source_box` (per-dim (start, stop))."""

    source: Device
    target: Device
    source_box: Box
    target_box: Box

    def to_json(self) -> dict[str, Any]:
        return {"source": list(self.source), "target": list(self.target),
                "source_box": [list(b) for b in self.source_box], "target_box": [list(b) for b in self.target_box]}


class StepDims(Mapping[str, Any]):
    """A step's `dims`, read-only, with some entries computed on first read: a permute's
    `transfers` list every device's tiles, which costs seconds on meshes of hundreds of devices
    and which only the simulator and the IR printer read (a plan is priced without them)."""

    __slots__ = ("_known", "_later")

    def __init__(self, known: Mapping[str, Any], later: Mapping[str, Callable[[], Any]] | None = None):
        self._known = dict(known)
        self._later = dict(later or {})

    def __getitem__(self, key: str) -> Any:
        if key not in self._known and key in self._later:
            self._known[key] = self._later.pop(key)()
        return self._known[key]

    def __iter__(self) -> Iterator[str]:
        yield from self._known
        yield from list(self._later)

    def __len__(self) -> int:
        return len(self._known) + len(self._later)

    def __contains__(self, key: object) -> bool:
        return key in self._known or key in self._later

    def __repr__(self) -> str:
        return f"StepDims({self._known}, later={sorted(self._later)})"


@dataclass(frozen=True, slots=True)
class CollectiveStep:
    """One collective of a resharding. `dims` holds the tensor dims and attributes involved, the
    `attrs` of its kind's row in `STEP_KINDS` (a permute's `transfers` fill every device's new
    buffer, self copies included). Local shapes are the largest shard (the
    buffer every device allocates); `bytes_per_device` is what `price` was given: the input
    buffer (for all_to_all and reduce_scatter padded to equal chunks per peer along the cut dim),
    or for permute and update_halo the most any device receives. An update_halo keeps the split and
    changes the halos, `before` to `after`, both halo sizes spelled flat as in the IR."""

    kind: str
    mesh_axes: tuple[str, ...]
    dims: Mapping[str, Any] = field(hash=False)
    in_local_shape: tuple[int, ...]
    out_local_shape: tuple[int, ...]
    bytes_per_device: float
    seconds: float
    before: Sharding
    after: Sharding

    @property
    def pairs(self) -> tuple[tuple[Device, Device], ...]:
        """(source, target) device pairs that exchange data in a permute (self copies left out)."""
        return tuple((t.source, t.target) for t in self.dims.get("transfers", ()) if t.source != t.target)

    def to_json(self) -> dict[str, Any]:
        dims = {k: [t.to_json() for t in v] if k == "transfers" else v for k, v in self.dims.items()}
        return {"kind": self.kind, "mesh_axes": list(self.mesh_axes), "dims": dims,
                "in_local_shape": list(self.in_local_shape), "out_local_shape": list(self.out_local_shape),
                "bytes_per_device": self.bytes_per_device, "seconds": self.seconds,
                "before": self.before.to_json(), "after": self.after.to_json()}


@dataclass(frozen=True, slots=True)
class Resharding:
    """The steps from `source` to `target`, and what they cost."""

    shape: tuple[int, ...]
    dtype_bytes: float
    source: Sharding
    target: Sharding
    steps: tuple[CollectiveStep, ...]
    max_bytes_received_per_device: float

    @property
    def seconds(self) -> float:
        return sum(step.seconds for step in self.steps)

    def to_json(self) -> dict[str, Any]:
        return {"shape": list(self.shape), "dtype_bytes": self.dtype_bytes, "source": self.source.to_json(),
                "target": self.target.to_json(), "steps": [s.to_json() for s in self.steps],
                "seconds": self.seconds, "max_bytes_received_per_device": self.max_bytes_received_per_device}


@dataclass(frozen=True, slots=True)
class BytesMovedPrice:
    """Ring-style bytes each device receives, over a flat link of `bytes_per_s_oneway`: a price for tests
    and for comparing plans without a hardware profile."""

    mesh: Mesh
    bytes_per_s_oneway: float = 1e9

    def __call__(self, kind: str, mesh_axes: tuple[str, ...], bytes_per_device: float) -> float:
        factor = _BY_PRICE_KIND[kind].ring_factor(self.mesh.group_size(mesh_axes))
        return factor * bytes_per_device / self.bytes_per_s_oneway


def bytes_moved_price(mesh: Mesh, bytes_per_s_oneway: float = 1e9) -> BytesMovedPrice:
    return BytesMovedPrice(mesh, bytes_per_s_oneway)
