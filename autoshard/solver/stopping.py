"""CP-SAT solves that a signal can stop.

CP-SAT holds its calling thread in C++, where Python runs no signal handler until the solve
returns, and by default takes SIGINT for itself: it ends that one solve and then leaves no Python
handler behind, so the first Ctrl-C is lost and the next kills the process without a word.
`cp_solver()` leaves the signals to Python, and a solve run inside `stoppable(solver)` is listed,
so that `stop_running_solves()`, called from any thread (the CLI's signal watcher), ends it at
once; Python's handler then raises in the thread that called the solve.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator

from ortools.sat.python import cp_model

_lock = threading.Lock()
_running: dict[int, cp_model.CpSolver] = {}


def cp_solver() -> cp_model.CpSolver:
    """A CP-SAT solver that leaves SIGINT to Python."""
    solver = cp_model.CpSolver()
    solver.parameters.catch_sigint_signal = False
    return solver


@contextlib.contextmanager
def stoppable(solver: cp_model.CpSolver) -> Iterator[None]:
    """Lists `solver` as running while the block (its solve) runs."""
    with _lock:
        _running[id(solver)] = solver
    try:
        yield
    finally:
        with _lock:
            del _running[id(solver)]


def stop_running_solves() -> None:
    """Ask every listed solve to stop now; they return their best solution so far."""
    with _lock:
        solvers = list(_running.values())
    for solver in solvers:
        solver.stop_search()
