"""Ctrl-C and SIGTERM stop any command within a second, with one line and exit 130 (`main`).

Both signals raise `KeyboardInterrupt` in the main thread, where Python runs its handlers between
two bytecodes. A CP-SAT solve holds the main thread in C++, where no handler runs: a watcher
thread, woken through the signals' wakeup fd, asks it to stop (`stop_running_solves`), and the
interrupt is raised as soon as it returns. A signal the parent set to be ignored stays ignored.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from types import FrameType
from typing import Iterator

INTERRUPTED = 130  # exit code: 128 + SIGINT, as shells report an interrupted command
SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def signals_interrupt() -> Iterator[None]:
    """SIGINT and SIGTERM raise `KeyboardInterrupt` in the block, stopping a running solve first."""
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield
        return
    previous = {number: signal.getsignal(number) for number in SIGNALS}
    for number, handler in previous.items():
        if handler is not signal.SIG_IGN:
            signal.signal(number, _interrupt)
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    previous_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    threading.Thread(target=_stop_solves_on_signals, args=(read_fd,), name="signals", daemon=True).start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(previous_fd)
        for number, handler in previous.items():
            signal.signal(number, handler)
        os.close(write_fd)  # the watcher reads the end of the pipe and closes its side


def _interrupt(number: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(signal.Signals(number).name)


def _stop_solves_on_signals(read_fd: int) -> None:
    while received := os.read(read_fd, 64):
        # the solver is looked up, not imported: importing it takes a second (ortools), during which
        # a Ctrl-C must already be handled, and no solve runs before it is imported
        stopping = sys.modules.get("autoshard.solver.stopping")
        if stopping is not None and any(number in SIGNALS for number in received):
            stopping.stop_running_solves()
    os.close(read_fd)
