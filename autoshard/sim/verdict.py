"""The outcome of simulating a plan: passed or not, the largest error, and where it first went wrong."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autoshard.mesh import Device


@dataclass(frozen=True, slots=True)
class Divergence:
    """Where a simulated program first departs from the reference."""

    op: str  # the graph op, or the collective (`all_reduce over ['x'] of 'h'`)
    tensor: str
    device: Device | None
    index: tuple[int, ...] | None  # global index of the first element outside the tolerance
    actual: float | None
    expected: float | None
    message: str

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "tensor": self.tensor, "device": list(self.device) if self.device is not None else None,
                "index": list(self.index) if self.index is not None else None, "actual": self.actual,
                "expected": self.expected, "message": self.message}


@dataclass(frozen=True, slots=True)
class Verdict:
    passed: bool
    max_error: float  # largest absolute difference from the reference over every value checked
    first_divergence: Divergence | None
    values_checked: int

    def summary(self) -> str:
        """`PASS max error ...` or `FAIL at op ... device ...: what differs`."""
        if self.first_divergence is None:
            return f"PASS max error {self.max_error:.3g} over {self.values_checked} values"
        d = self.first_divergence
        where = f" device {list(d.device)}" if d.device is not None else ""
        return f"FAIL at op {d.op!r}{where}: {d.message}"

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, "max_error": self.max_error, "values_checked": self.values_checked,
                "first_divergence": self.first_divergence.to_json() if self.first_divergence else None}
