"""What runs inside a worker process: one solve, reported over a pipe.

Messages to the service: `("progress", dict)` a few times a second while solving, then exactly
one of `("done", {"plan": document, "ir": [(stage, dialect, arguments, text), ...]})` or
`("failed", error)`. A thread watches the pipe: when the service goes away (its end closes),
the process exits instead of solving on for nobody.
"""

from __future__ import annotations

import math
import os
import threading
import time
from multiprocessing.connection import Connection
from typing import Any, Mapping

from autoshard.delivery.deliver import deliver
from autoshard.errors import AutoshardError, InfeasibleError, InputError
from autoshard.planning.make_plan import make_plan
from autoshard.phases import collect_garbage_rarely
from service.inputs import plan_inputs, slice_of
from service.ir import ir_arguments

PROGRESS_INTERVAL_S = 0.25


def failure(kind: str, message: str, problems: list[dict[str, str]] | None = None) -> dict[str, Any]:
    return {"kind": kind, "message": message, "problems": problems or []}


class ProgressSender:
    """Forwards the solver's progress reports (`phase, cost, bound, elapsed_s`), at most one per
    interval. Objective and bound are in picoseconds of objective (see `Weights`): of step time
    when only time is weighted."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self.started = time.monotonic()
        self.last = float("-inf")

    def phase(self, name: str) -> None:
        self.conn.send(("progress", {"phase": name, "elapsed_s": time.monotonic() - self.started}))

    def __call__(self, solver_phase: str, cost: float, bound: float, elapsed_s: float) -> None:
        now = time.monotonic()
        if now - self.last < PROGRESS_INTERVAL_S:
            return
        self.last = now
        objective, lower_bound = _finite(cost), _finite(bound)
        gap = (objective - lower_bound) / objective if objective and lower_bound is not None else None
        self.conn.send(("progress", {"phase": "solving", "solver_phase": solver_phase, "objective": objective,
                                     "lower_bound": lower_bound, "gap": gap, "solve_elapsed_s": elapsed_s,
                                     "elapsed_s": now - self.started}))


def _finite(value: float) -> float | None:
    """JSON has no infinities: an unknown objective or bound is null."""
    return float(value) if math.isfinite(value) else None


def _exit_with_service(conn: Connection) -> None:
    def watch() -> None:
        try:
            conn.recv()
        except (EOFError, OSError):
            pass
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-service", daemon=True).start()


def run(canonical: Mapping[str, Any], conn: Connection, verify_max_bytes: float) -> None:
    """Worker process entry point: solve the canonical request, send the outcome; the plan's
    simulation holds at most `verify_max_bytes` of host memory."""
    _exit_with_service(conn)
    collect_garbage_rarely()
    progress = ProgressSender(conn)
    try:
        progress.phase("formulating")
        inputs = plan_inputs(canonical)
        result = make_plan(inputs.graph, inputs.mesh, inputs.hardware, inputs.settings, progress=progress)
        progress.phase("emitting and verifying")
        delivered = deliver(result, inputs.hardware, inputs.topology, emit=inputs.emit, dialect=inputs.dialect,
                            verify=inputs.verify, verify_max_bytes=verify_max_bytes,
                            nodes=canonical["topology_options"].get("nodes"),
                            slice_shape=slice_of(canonical["topology_options"].get("slice")))
        ir = [(stage, inputs.dialect, ir_arguments(stage, "local"), text) for stage, text in delivered.ir.items()]
        progress.phase("done")
        conn.send(("done", {"plan": delivered.document, "ir": ir}))
    except InputError as error:
        conn.send(("failed", failure("input", str(error), [{"where": p.where, "message": p.message}
                                                            for p in error.problems])))
    except InfeasibleError as error:
        conn.send(("failed", failure("infeasible", str(error))))
    except AutoshardError as error:
        conn.send(("failed", failure("error", str(error))))
    except Exception as error:
        # a bug: the caller learns what broke, the service log gets the traceback
        conn.send(("failed", failure("internal", f"{type(error).__name__}: {error}")))
        raise
