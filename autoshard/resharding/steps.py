"""The steps of a resharding and what they cost: `Transfer`, `CollectiveStep`, `Resharding`,
the `Price` a caller gives the planner, and `BytesMovedPrice`, a price without a hardware profile.

`STEP_KINDS` are the collectives a resharding step may be (see README.md for their effects).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, NamedTuple

from autoshard.mesh import Device, Mesh
from autoshard.sharding import Sharding


Price = Callable[[str, tuple[str, ...], float], float]
Box = tuple[tuple[int, int], ...]

STEP_KINDS = ("all_gather", "all_slice", "all_to_all", "all_reduce", "reduce_scatter", "permute")


class Transfer(NamedTuple):
    """`target`'s new local `target_box` is `source`'s old local `source_box` (per-dim (start, stop))."""

    source: Device
    target: Device
    source_box: Box
    target_box: Box

    def to_json(self) -> dict[str, Any]:
        return {"source": list(self.source), "target": list(self.target),
                "source_box": [list(b) for b in self.source_box], "target_box": [list(b) for b in self.target_box]}


@dataclass(frozen=True, slots=True)
class CollectiveStep:
    """One collective of a resharding. `dims` holds the tensor dims and attributes involved:
    all_gather `gather_axis`; all_slice `slice_axis`; all_to_all `split_axis`, `concat_axis`;
    all_reduce `reduction`; reduce_scatter `reduction`, `scatter_axis`; permute `transfers`
    (every device's new buffer, self copies included). Local shapes are the largest shard (the
    buffer every device allocates); `bytes_per_device` is what `price` was given: the input
    buffer (for all_to_all and reduce_scatter padded to equal chunks per peer along the cut dim),
    or for permute the most any device receives."""

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
    """Ring-style bytes each device receives, over a flat `bytes_per_s` link: a price for tests
    and for comparing plans without a hardware profile."""

    mesh: Mesh
    bytes_per_s: float = 1e9

    def __call__(self, kind: str, mesh_axes: tuple[str, ...], bytes_per_device: float) -> float:
        g = self.mesh.group_size(mesh_axes)
        factor = {"all_gather": g - 1, "all_slice": 0.0, "all_to_all": (g - 1) / g, "reduce_scatter": (g - 1) / g,
                  "all_reduce": 2 * (g - 1) / g, "send_recv": 1.0}[kind]
        return factor * bytes_per_device / self.bytes_per_s


def bytes_moved_price(mesh: Mesh, bytes_per_s: float = 1e9) -> BytesMovedPrice:
    return BytesMovedPrice(mesh, bytes_per_s)
