"""What runs inside a worker process: one solve, reported over a pipe.

Messages to the service: `("progress", dict)` a few times a second while solving, then exactly
one of `("done", {"plan": document, "ir": [(stage, dialect, arguments, text), ...]})`,
`("failed", error)` or, asked to `("stop",)` by a service shutting down, `("interrupted",
{"plan": document})` with the best plan found so far. A thread watches the pipe: when the
service goes away (its end closes), the process exits instead of solving on for nobody.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from typing import Any

from autoshard.delivery.deliver import deliver
from autoshard.delivery.document import plan_document
from autoshard.errors import AutoshardError, InfeasibleError, InputError
from autoshard.graph.recompute import record_recompute
from autoshard.phases import collect_garbage_rarely
from autoshard.planning.compose import plan_layer_once
from autoshard.planning.pipeline_plan import plan_pipeline
from autoshard.planning.make_plan import BestSoFar, make_plan
from service.inputs import plan_inputs, slice_of, topology_name
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
        self._sending = threading.Lock()  # the solve and the pipe's watcher both send

    def send(self, kind: str, payload: dict[str, Any]) -> None:
        with self._sending:
            self.conn.send((kind, payload))

    def phase(self, name: str) -> None:
        self.send("progress", {"phase": name, "elapsed_s": time.monotonic() - self.started})

    def __call__(self, solver_phase: str, cost: float, bound: float, elapsed_s: float) -> None:
        now = time.monotonic()
        if now - self.last < PROGRESS_INTERVAL_S:
            return
        self.last = now
        objective, lower_bound = _finite(cost), _finite(bound)
        gap = (objective - lower_bound) / objective if objective and lower_bound is not None else None
        self.send("progress", {"phase": "solving", "solver_phase": solver_phase, "objective": objective,
                               "lower_bound": lower_bound, "gap": gap, "solve_elapsed_s": elapsed_s,
                               "elapsed_s": now - self.started})


def _finite(value: float) -> float | None:
    """JSON has no infinities: an unknown objective or bound is null."""
    return float(value) if math.isfinite(value) else None


def _watch_service(conn: Connection, on_stop: Callable[[], None]) -> None:
    """Exit when the service asks to stop (after `on_stop`) or goes away."""
    def watch() -> None:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            os._exit(1)
        if message == ("stop",):
            on_stop()
        os._exit(0)

    threading.Thread(target=watch, name="watch-service", daemon=True).start()


def _hand_over(best: BestSoFar, canonical: Mapping[str, Any], progress: ProgressSender) -> None:
    """Send the best plan found so far (priced, not verified: there is no time left for that)."""
    try:
        result = best.result()
        if result is None:
            progress.send("failed", failure("interrupted", "the service stopped before the solver had found a plan"))
            return
        document = plan_document(result, topology_name(canonical["topology"]))
        placed = canonical["topology_options"]
        document["topology_options"] = {key: value for key, value in
                                        (("nodes", placed.get("nodes")), ("slice", slice_of(placed.get("slice"))))
                                        if value is not None}
        record_recompute(document, canonical["options"].get("recompute", "none"))
        progress.send("interrupted", {"plan": document})
    except Exception as error:
        # a bug: the caller learns what broke
        progress.send("failed", failure("internal", f"handing over the best plan: {type(error).__name__}: {error}"))


def run(canonical: Mapping[str, Any], conn: Connection, verify_max_bytes: float) -> None:
    """Worker process entry point: solve the canonical request, send the outcome; the plan's
    simulation holds at most `verify_max_bytes` of host memory."""
    collect_garbage_rarely()
    progress = ProgressSender(conn)
    best = BestSoFar()
    _watch_service(conn, lambda: _hand_over(best, canonical, progress))
    try:
        progress.phase("formulating")
        inputs = plan_inputs(canonical)
        pipelined = None
        if inputs.pipeline is not None:
            pipelined = plan_pipeline(inputs.graph, inputs.mesh, inputs.hardware, inputs.settings, inputs.pipeline,
                                      progress=progress, best_so_far=best)
            result = pipelined.result
        elif inputs.layer_once:
            result = plan_layer_once(inputs.graph, inputs.mesh, inputs.hardware, inputs.settings)
        else:
            result = make_plan(inputs.graph, inputs.mesh, inputs.hardware, inputs.settings, progress=progress,
                               best_so_far=best)
        progress.phase("emitting and verifying")
        delivered = deliver(result, inputs.hardware, inputs.topology, emit=inputs.emit, dialect=inputs.dialect,
                            verify=inputs.verify, verify_max_bytes=verify_max_bytes,
                            optimize_collectives=inputs.optimize_collectives,
                            nodes=canonical["topology_options"].get("nodes"),
                            slice_shape=slice_of(canonical["topology_options"].get("slice")),
                            pipeline=pipelined.cut if pipelined is not None else None)
        if pipelined is not None:
            delivered.document["pipeline"] = pipelined.to_json()
        record_recompute(delivered.document, canonical["options"].get("recompute", "none"))
        ir = [(stage, inputs.dialect, ir_arguments(stage, "local"), text) for stage, text in delivered.ir.items()]
        progress.phase("done")
        progress.send("done", {"plan": delivered.document, "ir": ir})
    except InputError as error:
        progress.send("failed", failure("input", str(error), [{"where": p.where, "message": p.message}
                                                              for p in error.problems]))
    except InfeasibleError as error:
        progress.send("failed", failure("infeasible", str(error)))
    except AutoshardError as error:
        progress.send("failed", failure("error", str(error)))
    except Exception as error:
        # a bug: the caller learns what broke, the service log gets the traceback
        progress.send("failed", failure("internal", f"{type(error).__name__}: {error}"))
        raise
