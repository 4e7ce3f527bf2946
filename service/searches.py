"""Configuration searches of the service: each runs in a thread of its own that only waits on the
search's worker processes (the solves run there, never in the API's event loop), at most one
search at a time; jobs live in memory, for as long as the service runs.

A search's progress is the candidates bounded and solved so far; cancelling sets a flag the
search polls, which stops its workers.
"""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from autoshard.delivery.deliver import deliver
from autoshard.errors import AutoshardError, InputError, OutOfTime, Problem
from autoshard.graph.schema import load_graph
from autoshard.search.ranking import best_plan, ranking_document
from autoshard.search.run import Entry, SearchCancelled, SearchOptions, search
from autoshard.search.tasks import SearchInputs
from autoshard.search.throughput import throughput

_FIELDS = {"devices": "/devices", "max_axes": "/options/max_axes", "fix": "/options/fix", "jobs": "/options/jobs",
           "ray": "/options/ray", "time_budget_s": "/options/time_budget_s", "topology": "/topology"}


def request_problem_at(where: str) -> str:
    """A search option's name as the request field it comes from (a JSON pointer)."""
    return _FIELDS.get(where, "/topology" if where.startswith("topology") else where or "/")


@dataclass
class SearchJob:
    id: str
    graph: dict[str, Any]
    options: SearchOptions
    status: str = "queued"  # queued, searching, done, failed, cancelled
    progress: dict[str, Any] = field(default_factory=dict)
    ranking: dict[str, Any] | None = None
    plan: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    cancel: threading.Event = field(default_factory=threading.Event)

    @property
    def final(self) -> bool:
        return self.status in ("done", "failed", "cancelled")


class Searches:
    def __init__(self) -> None:
        self._jobs: dict[str, SearchJob] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="autoshard-search")

    def submit(self, graph: dict[str, Any], options: SearchOptions) -> SearchJob:
        job = SearchJob(uuid.uuid4().hex, graph, options)
        with self._lock:
            self._jobs[job.id] = job
        self._pool.submit(self._run, job)
        return job

    def get(self, search_id: str) -> SearchJob | None:
        with self._lock:
            return self._jobs.get(search_id)

    def cancel(self, job: SearchJob) -> None:
        job.cancel.set()
        if job.status == "queued":
            self._set(job, status="cancelled")

    def shutdown(self) -> None:
        with self._lock:
            jobs = list(self._jobs.values())
        for job in jobs:
            job.cancel.set()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _set(self, job: SearchJob, **changes: Any) -> None:
        with self._lock:
            for name, value in changes.items():
                setattr(job, name, value)
            job.updated_at = time.time()

    def _run(self, job: SearchJob) -> None:
        if job.cancel.is_set():
            return
        self._set(job, status="searching")

        def progress(phase: str, done: int, total: int, entry: Entry) -> None:
            self._set(job, progress={"phase": phase, "done": done, "total": total, "last": entry.candidate.label,
                                     "outcome": entry.outcome})

        try:
            result = search(job.graph, job.options, progress=progress, cancelled=job.cancel.is_set)
            rates = throughput(load_graph(job.graph), job.options.topology)
            ranking = ranking_document(result, job.options, str(job.graph.get("name", "")), rates)
            if result.best is None:  # the ranking says what each candidate came to
                error = result.no_plan_error()
                kind = "timeout" if isinstance(error, OutOfTime) else "infeasible"
                self._set(job, status="failed", ranking=ranking, error={"kind": kind, "message": str(error),
                                                                        "problems": []})
                return
            inputs = SearchInputs(job.graph, job.options.topology, job.options.settings)
            plan_result, hardware = best_plan(result, inputs)
            candidate = result.best.candidate
            plan = deliver(plan_result, hardware, job.options.topology, verify="never", nodes=candidate.nodes,
                           slice_shape=candidate.slice_shape, mapping=candidate.mapping_json).document
            self._set(job, status="done", ranking=ranking, plan=plan)
        except SearchCancelled:
            self._set(job, status="cancelled")
        except InputError as error:
            self._set(job, status="failed", error={"kind": "input", "message": str(error), "problems": [
                {"where": request_problem_at(p.where), "message": p.message} for p in error.problems]})
        except AutoshardError as error:
            self._set(job, status="failed", error={"kind": "error", "message": str(error), "problems": []})
        except Exception as error:  # a bug: the job says so instead of staying "searching" forever
            self._set(job, status="failed", error={"kind": "internal", "message": f"{type(error).__name__}: {error}",
                                                   "problems": []})


def search_problems(error: InputError) -> InputError:
    return InputError([Problem(request_problem_at(p.where), p.message) for p in error.problems])
