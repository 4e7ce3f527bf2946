"""Which queued job starts next, and in which lane: a small job never waits behind heavy ones.

Jobs wait in one queue, in the order they came. `workers` main slots take any job, oldest first.
When every main slot is busy, `fast_workers` more slots (the fast lane) take the oldest *small*
jobs, those whose size estimate at admission (`job_size`) is at most the service's limit: a small
job then starts at once instead of waiting for a heavy solve to end, and a heavy job never takes a
fast slot, so the lane stays free for the next small one. A heavy job still gets the next main
slot that frees up: small jobs never overtake it there.

Pure bookkeeping, no threads or processes: the runner calls it under its lock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Literal

Lane = Literal["main", "fast"]


@dataclass
class Lanes:
    workers: int
    fast_workers: int
    _waiting: deque[tuple[str, bool]] = field(default_factory=deque)  # (job id, small), oldest first
    _busy: dict[str, int] = field(default_factory=lambda: {"main": 0, "fast": 0})

    def add(self, job_id: str, small: bool) -> None:
        self._waiting.append((job_id, small))

    def take(self) -> list[tuple[str, Lane]]:
        """The jobs to start now, each with its lane, oldest first; they leave the queue."""
        started: list[tuple[str, Lane]] = []
        still_waiting: deque[tuple[str, bool]] = deque()
        for job_id, small in self._waiting:
            lane = self._free_lane(small)
            if lane is None:
                still_waiting.append((job_id, small))
                continue
            self._busy[lane] += 1
            started.append((job_id, lane))
        self._waiting = still_waiting
        return started

    def release(self, lane: Lane) -> None:
        """A job of `lane` has ended: its slot is free."""
        self._busy[lane] -= 1

    def _free_lane(self, small: bool) -> Lane | None:
        if self._busy["main"] < self.workers:
            return "main"
        if small and self._busy["fast"] < self.fast_workers:
            return "fast"
        return None


def job_size(canonical: dict) -> int:
    """How heavy a plan request is, from its canonical form alone (no formulation): the pairs of
    shardings its solve may price, summed over every op input. A tensor of rank r has about
    (r + 1) ** axes shardings on a mesh of `axes` axes (each axis splits one of its dims or none),
    and the formulation prices a resharding between each producer's and each consumer's: this
    grows with the graph and steeply with the mesh's axes, as formulation time does
    (`examples/mlp.json`: 810 on two axes, 65,610 on four). A measure to compare with a limit, not
    a count."""
    axes = canonical["mesh"].count("=")
    tensors = canonical["graph"]["tensors"]
    return sum((len(tensors[name]["shape"]) + 1) ** (2 * axes)
               for op in canonical["graph"]["ops"] for name in op["inputs"])
