"""A stand-in for `service.solve_job.run` in a worker process, for testing the runner's scheduling
without real solves: a job whose graph is named "heavy" solves until the service stops or cancels
it; any other answers at once with a plan naming its graph."""

from __future__ import annotations

from multiprocessing.connection import Connection
from typing import Any


def fake_solve(canonical: dict[str, Any], conn: Connection, verify_max_bytes: float) -> None:
    name = canonical["graph"]["name"]
    if name == "heavy":
        try:
            conn.recv()  # a stop from a shutdown, or EOF once the service goes away
        except EOFError:
            pass
        return
    conn.send(("done", {"plan": {"graph": name}, "ir": []}))
