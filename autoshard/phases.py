"""The wall time and peak memory of each phase a plan goes through (load, formulate, solve,
pricing, partition, collective optimisations, verification, IR emission, writing), for
`plan.json`'s `phases` and for progress on stderr, so that a long phase is never silent.

A phase's peak is the most resident memory the process held during it: Linux's high-water mark
(`VmHWM`) is reset when the phase starts and read when it ends. Where that reset is not allowed,
the process's peak so far stands in (an upper bound).
"""

from __future__ import annotations

import gc
import resource
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

_CLEAR_REFS = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")
LONG_PHASE_S = 3.0  # a phase running longer than this is announced, and again every REPEAT_S
REPEAT_S = 10.0


# Python's default collector thresholds (700, 10, 10) walk every live object again and again while
# a large graph is built: with tens of thousands of ops that made loading a 96-layer graph 6.6x
# slower than a 32-layer one (3x with these thresholds) and partitioning it 3.2x. The pipeline
# builds trees of frozen records, not reference cycles, so collecting rarely loses nothing.
GC_THRESHOLDS = (100_000, 20, 100)


def collect_garbage_rarely() -> None:
    """Set the collector for a process that runs plan commands (the CLI, a service worker)."""
    gc.set_threshold(*GC_THRESHOLDS)


def _reset_peak() -> bool:
    try:
        _CLEAR_REFS.write_text("5")  # "5": reset the peak resident set size only
        return True
    except OSError:
        return False


def _peak_rss_bytes(reset_worked: bool) -> int:
    if reset_worked:
        try:
            for line in _STATUS.read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


class PhaseTimes:
    """Phases in the order they ran, each `{"wall_s": ..., "peak_rss_bytes": ...}`; `announce`
    (say, a print to stderr) hears of every phase that runs longer than `LONG_PHASE_S`."""

    def __init__(self, announce: Callable[[str], None] | None = None):
        self.entries: dict[str, dict[str, float]] = {}
        self.announce = announce

    @contextmanager
    def phase(self, name: str, *, reports_itself: bool = False) -> Iterator[None]:
        """Time the block as phase `name` (a phase entered twice adds up). `reports_itself`: the
        phase prints its own progress (the solver), so only its end is announced."""
        reset_worked = _reset_peak()
        started = time.perf_counter()
        stop = threading.Event()
        ticker = None
        if self.announce is not None and not reports_itself:
            ticker = threading.Thread(target=self._tick, args=(name, started, stop), daemon=True)
            ticker.start()
        ended = False
        try:
            yield
            ended = True
        finally:
            stop.set()
            if ticker is not None:
                ticker.join()
            wall_s = time.perf_counter() - started
            peak = _peak_rss_bytes(reset_worked)
            entry = self.entries.setdefault(name, {"wall_s": 0.0, "peak_rss_bytes": 0})
            entry["wall_s"] += wall_s
            entry["peak_rss_bytes"] = max(entry["peak_rss_bytes"], peak)
            if self.announce is not None and wall_s > LONG_PHASE_S and ended:  # an interrupt says so itself
                self.announce(f"{name}: {wall_s:.1f} s, peak {peak / 2 ** 30:.2f} GiB resident")

    def _tick(self, name: str, started: float, stop: threading.Event) -> None:
        wait = LONG_PHASE_S
        while not stop.wait(wait):
            self.announce(f"{name}: {time.perf_counter() - started:.0f} s so far")
            wait = REPEAT_S

    def total_s(self) -> float:
        return sum(entry["wall_s"] for entry in self.entries.values())

    def to_json(self) -> dict[str, dict[str, float]]:
        return {name: dict(entry) for name, entry in self.entries.items()}
