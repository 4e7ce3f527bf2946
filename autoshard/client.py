"""A small typed client of the plan service (`autoshard serve`).

    with Client("http://127.0.0.1:8000") as client:
        job = client.plan(graph, "dp=2,tp=4", "dgx-h100", options={"time_limit_s": 10})
        totals = job.plan["totals"]  # the additive step, and with hideable communication behind compute
        print(totals["step_s"], totals["overlapped_step_s"], totals["hidden_s_per_axis"])
        print(client.ir(job.id, stage="partitioned"))

Errors the service reports come back as `ServiceError` with the same `Problem`s the CLI prints
(their `where` points into the request body).
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import httpx

from autoshard.errors import AutoshardError, Problem
from autoshard.graph.model import Graph
from autoshard.graph.schema import graph_to_json
from autoshard.mesh import Mesh

FINAL_STATUSES = ("done", "failed", "cancelled", "interrupted")


class ServiceError(AutoshardError):
    """The service refused a request: HTTP status, error kind, message and every problem."""

    def __init__(self, status: int, kind: str, message: str, problems: list[Problem]):
        self.status = status
        self.kind = kind
        self.problems = problems
        details = "".join(f"\n  {p}" for p in problems)
        super().__init__(f"HTTP {status} ({kind}): {message}{details}")


class PlanFailed(AutoshardError):
    """A plan job ended without a plan (failed or cancelled)."""

    def __init__(self, job: "PlanJob"):
        self.job = job
        error = job.error or {}
        super().__init__(f"plan {job.id} {job.status}: {error.get('message', '')}".rstrip(": "))


@dataclass(frozen=True)
class PlanJob:
    id: str
    status: str
    progress: dict[str, Any] = field(default_factory=dict)
    plan: dict[str, Any] | None = None
    ir: dict[str, str] = field(default_factory=dict)
    error: dict[str, Any] | None = None

    @property
    def final(self) -> bool:
        return self.status in FINAL_STATUSES

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "PlanJob":
        return cls(data["id"], data["status"], data.get("progress") or {}, data.get("plan"), data.get("ir") or {},
                   data.get("error"))


GraphLike = Graph | Mapping[str, Any]
MeshLike = Mesh | str | Mapping[str, Any]
TopologyLike = str | Mapping[str, Any]


def _graph(graph: GraphLike) -> dict[str, Any]:
    return graph_to_json(graph) if isinstance(graph, Graph) else dict(graph)


def _mesh(mesh: MeshLike) -> str | dict[str, Any]:
    if isinstance(mesh, Mesh):
        return {"axes": [{"name": n, "size": s} for n, s in zip(mesh.axis_names, mesh.shape)]}
    return mesh if isinstance(mesh, str) else dict(mesh)


class Client:
    """`base_url` of a running service, or `http=` an `httpx.Client` already pointed at one
    (e.g. FastAPI's `TestClient`)."""

    def __init__(self, base_url: str = "http://127.0.0.1:8000", *, timeout_s: float = 60.0,
                 http: httpx.Client | None = None):
        self._own = http is None
        self.http = http if http is not None else httpx.Client(base_url=base_url, timeout=timeout_s)

    def close(self) -> None:
        if self._own:
            self.http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _call(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        response = self.http.request(method, url, **kwargs)
        if response.status_code >= 400:
            try:
                error = response.json()["error"]
            except (ValueError, KeyError, TypeError):
                raise ServiceError(response.status_code, "http", response.text, []) from None
            raise ServiceError(response.status_code, error["kind"], error["message"],
                               [Problem(p["where"], p["message"]) for p in error.get("problems", [])])
        return response

    def submit(self, graph: GraphLike, mesh: MeshLike, topology: TopologyLike = "dgx-h100", *,
               topology_options: Mapping[str, Any] | None = None, options: Mapping[str, Any] | None = None,
               wait_s: float = 0.0) -> PlanJob:
        """Start a solve (or find the identical one already stored); wait up to `wait_s` for it."""
        body = {"graph": _graph(graph), "mesh": _mesh(mesh), "topology": topology,
                "topology_options": dict(topology_options or {}), "options": dict(options or {})}
        return PlanJob.from_json(self._call("POST", "/v1/plans", json=body, params={"wait": wait_s}).json())

    def get(self, plan_id: str) -> PlanJob:
        return PlanJob.from_json(self._call("GET", f"/v1/plans/{plan_id}").json())

    def poll(self, plan_id: str, timeout_s: float = 120.0, interval_s: float = 0.2) -> PlanJob:
        """The job once it has ended; `TimeoutError` if it has not within `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        while True:
            job = self.get(plan_id)
            if job.final:
                return job
            if time.monotonic() >= deadline:
                raise TimeoutError(f"plan {plan_id} still {job.status} after {timeout_s:g} s")
            time.sleep(min(interval_s, max(deadline - time.monotonic(), 0.0)))

    def plan(self, graph: GraphLike, mesh: MeshLike, topology: TopologyLike = "dgx-h100", *,
             topology_options: Mapping[str, Any] | None = None, options: Mapping[str, Any] | None = None,
             timeout_s: float = 120.0) -> PlanJob:
        """Submit and wait for the plan; `PlanFailed` if the job ends without one."""
        job = self.submit(graph, mesh, topology, topology_options=topology_options, options=options)
        job = self.poll(job.id, timeout_s) if not job.final else job
        if job.status != "done":
            raise PlanFailed(job)
        return job

    def ir(self, plan_id: str, stage: str = "annotated", dialect: str | None = None,
           arguments: str = "local") -> str:
        params = {"stage": stage, "arguments": arguments} | ({"dialect": dialect} if dialect else {})
        return self._call("GET", f"/v1/plans/{plan_id}/ir", params=params).text

    def cancel(self, plan_id: str) -> PlanJob:
        return PlanJob.from_json(self._call("DELETE", f"/v1/plans/{plan_id}").json())

    def estimate(self, graph: GraphLike, mesh: MeshLike, plan: Mapping[str, Any],
                 topology: TopologyLike = "dgx-h100", *,
                 topology_options: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Totals, per-op costs and reshardings of a given plan (per-op options and/or shardings)."""
        body = {"graph": _graph(graph), "mesh": _mesh(mesh), "topology": topology,
                "topology_options": dict(topology_options or {}), "plan": dict(plan)}
        return self._call("POST", "/v1/estimate", json=body).json()

    def validate(self, graph: GraphLike, mesh: MeshLike | None = None,
                 plan: Mapping[str, Any] | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"graph": _graph(graph)}
        if mesh is not None:
            body["mesh"] = _mesh(mesh)
        if plan is not None:
            body["plan"] = dict(plan)
        return self._call("POST", "/v1/validate", json=body).json()

    def topologies(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/topologies").json()


class LocalService:
    """`autoshard serve` in a child process on a free loopback port, for notebooks and tests.

        with LocalService("plans.sqlite3") as client:
            client.topologies()

    or `client = service.start()` ... `service.stop()` across notebook cells; a service still
    running when the Python process exits is stopped then.
    """

    def __init__(self, db: str | Path, *, workers: int = 1, env: Mapping[str, str] | None = None,
                 log: str | Path | None = None, startup_timeout_s: float = 60.0):
        self.db, self.workers, self.env = Path(db), workers, dict(env or {})
        self.log = Path(log) if log is not None else self.db.with_suffix(".log")
        self.startup_timeout_s = startup_timeout_s
        self.process: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.client: Client | None = None

    def start(self) -> Client:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        command = [sys.executable, "-m", "autoshard.cli.main", "serve", "--port", str(port), "--db", str(self.db),
                   "--workers", str(self.workers), "--log-level", "warning"]
        with open(self.log, "a") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                            env=os.environ | self.env)
        atexit.register(self.stop)
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"autoshard serve exited with code {self.process.returncode}:\n"
                                   f"{self.log.read_text()}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1.0).status_code == 200:
                    self.client = Client(self.url)
                    return self.client
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(f"autoshard serve did not answer within {self.startup_timeout_s:g} s; see {self.log}")

    def stop(self, *, crash: bool = False) -> None:
        """SIGTERM (a clean stop), or with `crash` SIGKILL, as a machine failure would."""
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL if crash else signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        atexit.unregister(self.stop)

    def __enter__(self) -> Client:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()
