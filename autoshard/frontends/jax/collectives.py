"""A plan's collectives beside the ones XLA compiled for it: per kind, how many and the bytes per
device, counted alike on both sides (`hlo`). The plan's are those of its partitioned program as
solved (before autoshard's own collective optimisations, as XLA is handed the shardings only);
an `all_slice` moves no data and compiles to a local slice, so it has no counterpart.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from autoshard.frontends.jax.hlo import KINDS, Collective
from autoshard.planning.plan import Plan
from autoshard.resharding import Price
from autoshard.spmd.program import partition

# the plan's step kinds -> the HLO opcode that carries them
HLO_KIND = {"all_gather": "all-gather", "all_reduce": "all-reduce", "reduce_scatter": "reduce-scatter",
            "all_to_all": "all-to-all", "permute": "collective-permute"}
BYTES_TOLERANCE = 0.10  # relative


def planned_collectives(plan: Plan, price: Price | None = None) -> list[Collective]:
    """The collectives of `plan`'s partitioned program, priced (chosen) by `price`."""
    program = partition(plan, price)
    return [Collective(HLO_KIND[c.step.kind], plan.mesh.group_size(c.step.mesh_axes), int(c.step.bytes_per_device),
                       str(c.step.after), c.input.tensor)
            for c in program.communicates() if c.step.kind in HLO_KIND]


@dataclass(frozen=True)
class KindComparison:
    kind: str
    plan_count: int
    plan_bytes_per_device: int
    xla_count: int
    xla_bytes_per_device: int

    @property
    def agrees(self) -> bool:
        """Equal counts, and bytes within `BYTES_TOLERANCE` of the plan's."""
        return (self.plan_count == self.xla_count
                and abs(self.xla_bytes_per_device - self.plan_bytes_per_device)
                <= BYTES_TOLERANCE * max(self.plan_bytes_per_device, 1))

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "plan": {"count": self.plan_count, "bytes_per_device": self.plan_bytes_per_device},
                "xla": {"count": self.xla_count, "bytes_per_device": self.xla_bytes_per_device}}


def compare_collectives(planned: Sequence[Collective], compiled: Sequence[Collective]) -> list[KindComparison]:
    """Per kind either side uses, in `hlo.KINDS` order: counts and bytes per device side by side."""
    out = []
    for kind in KINDS:
        ours = [c for c in planned if c.kind == kind]
        theirs = [c for c in compiled if c.kind == kind]
        if ours or theirs:
            out.append(KindComparison(kind, len(ours), sum(c.bytes_per_device for c in ours),
                                      len(theirs), sum(c.bytes_per_device for c in theirs)))
    return out
