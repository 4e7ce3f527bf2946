"""Runs solves in worker processes, at most `settings.workers` at a time, plus a fast lane of
`settings.fast_lane_workers` for small jobs while every worker is busy (`service/lanes.py`).

Each job gets its own process (forkserver: the library is imported once in the server, each
solve is a cheap fork of it; spawn where forkserver does not exist), supervised by a thread
that stores its progress and outcome. Cancelling or outliving the time limit terminates the
process; the API's event loop never waits on a solve.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any, Callable

from service.config import Settings
from service.lanes import Lane, Lanes, job_size
from service.solve_job import failure, run
from service.store import Job, Store

_PRELOAD = ["service.solve_job"]
_STOP_TIMEOUT_S = 5.0
_POLL_S = 0.1


def process_context(method: str) -> BaseContext:
    if method == "forkserver" and "forkserver" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(_PRELOAD)
        return context
    return multiprocessing.get_context("spawn")


class Runner:
    def __init__(self, store: Store, settings: Settings, solve: Callable[[Any, Connection, float], None] = run):
        """`solve` is what a worker process runs (`solve_job.run`; tests pass a stand-in)."""
        self.store = store
        self.settings = settings
        self._solve = solve
        self._context = process_context(settings.start_method)
        # one supervising thread per started job; the lanes decide how many start
        self._pool = ThreadPoolExecutor(max_workers=settings.workers + settings.fast_lane_workers,
                                        thread_name_prefix="autoshard-solve")
        self._lanes = Lanes(settings.workers, settings.fast_lane_workers)
        self._lock = threading.Lock()
        self._cancel: dict[str, threading.Event] = {}
        self._finished: dict[str, threading.Event] = {}
        self._closing = threading.Event()

    def submit(self, key: str, canonical: dict[str, Any]) -> Job:
        """A new job for these inputs, or the stored one if an identical request is done or under way."""
        with self._lock:
            existing = self.store.find_reusable(key)
            if existing is not None:
                return existing
            job = self.store.create(key, canonical)
            self._enqueue(job.id, canonical)
        self._dispatch()
        return job

    def resume(self, job_ids: list[str]) -> None:
        """Run jobs already stored as queued (left by a previous process), in order."""
        with self._lock:
            for job_id in job_ids:
                job = self.store.get(job_id)
                if job is not None:
                    self._enqueue(job_id, job.request)
        self._dispatch()

    def _enqueue(self, job_id: str, canonical: dict[str, Any]) -> None:
        """Under the lock: the job waits for a slot, small or not by its size at admission."""
        self._cancel[job_id] = threading.Event()
        self._finished[job_id] = threading.Event()
        self._lanes.add(job_id, small=job_size(canonical) <= self.settings.fast_lane_max_size)

    def _dispatch(self) -> None:
        """Start every job a free slot can take."""
        with self._lock:
            if self._closing.is_set():
                return  # queued jobs stay queued in the store and run after the next start
            for job_id, lane in self._lanes.take():
                self._pool.submit(self._run, job_id, lane)

    def cancel(self, job_id: str) -> bool:
        """Cancel a queued or solving job; False if it had already ended."""
        if not self.store.cancel(job_id):
            return False
        with self._lock:
            for events in (self._cancel, self._finished):
                if job_id in events:
                    events[job_id].set()
        return True

    async def wait(self, job_id: str, timeout_s: float) -> None:
        """Return once the job has ended or `timeout_s` has passed, without holding a thread."""
        with self._lock:
            finished = self._finished.get(job_id)
        if finished is None:  # not running in this process: already ended
            return
        deadline = time.monotonic() + timeout_s
        while not finished.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(min(0.05, max(deadline - time.monotonic(), 0)))

    def shutdown(self) -> None:
        """Stop every solve: a solving job is kept as interrupted with the best plan its solver
        hands over within `stop_grace_s` (else the next start marks it interrupted); queued jobs
        stay queued and run after the next start."""
        with self._lock:  # no job starts after this
            self._closing.set()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _run(self, job_id: str, lane: Lane) -> None:
        try:
            job = self.store.get(job_id)
            if job is None or self._closing.is_set() or not self.store.start(job_id):
                return
            self._supervise(job)
        finally:
            with self._lock:
                self._cancel.pop(job_id, None)
                finished = self._finished.pop(job_id, None)
                self._lanes.release(lane)
            if finished is not None:
                finished.set()
            self._dispatch()

    def _supervise(self, job: Job) -> None:
        ours, theirs = self._context.Pipe(duplex=True)
        process = self._context.Process(target=self._solve, args=(job.request, theirs, self.settings.max_verify_bytes), name=f"autoshard-solve-{job.id[:8]}",
                                        daemon=True)
        process.start()
        theirs.close()
        limit_s = job.request["options"]["time_limit_s"]
        deadline = time.monotonic() + limit_s + self.settings.solve_grace_s
        cancel = self._cancel[job.id]
        ended = False  # the process reported its outcome (or died): let it exit by itself
        try:
            while not (ended or cancel.is_set() or self._closing.is_set()):
                if time.monotonic() > deadline:
                    self.store.fail(job.id, failure("timeout", f"the solve was still running {self.settings.solve_grace_s:g} s "
                                                                f"after its time limit of {limit_s:g} s; it was stopped"))
                    break
                if ours.poll(_POLL_S):
                    ended = self._receive(job.id, ours, process)
                elif not process.is_alive() and not ours.poll():
                    self._died(job.id, process)
                    ended = True
            if self._closing.is_set() and not (ended or cancel.is_set()):
                ended = self._hand_over(job.id, ours, process)
        finally:
            _stop(process, _STOP_TIMEOUT_S if ended else 0.0)
            ours.close()

    def _hand_over(self, job_id: str, conn: Connection, process: BaseProcess) -> bool:
        """Ask a solve the service is leaving for its best plan so far; True once the job has an
        outcome (that plan, or the solve's own outcome if it ended meanwhile)."""
        try:
            conn.send(("stop",))
        except OSError:
            return False
        deadline = time.monotonic() + self.settings.stop_grace_s
        while time.monotonic() < deadline:
            if conn.poll(_POLL_S):
                try:
                    message = conn.recv()
                except EOFError:
                    return False
                if self._take(job_id, message):
                    return True
            elif not process.is_alive():
                return False
        return False

    def _receive(self, job_id: str, conn: Connection, process: BaseProcess) -> bool:
        """Handle one message; True once the job has an outcome."""
        try:
            message = conn.recv()
        except EOFError:
            self._died(job_id, process)
            return True
        return self._take(job_id, message)

    def _take(self, job_id: str, message: tuple[str, dict[str, Any]]) -> bool:
        """Store one message of a solve; True once the job has an outcome."""
        kind, payload = message
        if kind == "progress":
            self.store.set_progress(job_id, payload)
            return False
        if kind == "done":
            self.store.finish(job_id, payload["plan"], payload["ir"])
        elif kind == "interrupted":
            gap = payload["plan"]["solver"]["gap"]
            self.store.interrupt(job_id, payload["plan"], failure(
                "interrupted", f"the service stopped during the solve; the plan is the best found by then "
                               f"(within {gap:.2%} of the lower bound)"))
        else:
            self.store.fail(job_id, payload)
        return True

    def _died(self, job_id: str, process: BaseProcess) -> None:
        process.join(_STOP_TIMEOUT_S)
        self.store.fail(job_id, failure("internal", f"the solver process ended without a result "
                                                    f"(exit code {process.exitcode}); see the service log"))


def _stop(process: BaseProcess, grace_s: float) -> None:
    process.join(grace_s)
    if process.is_alive():
        process.terminate()
        process.join(_STOP_TIMEOUT_S)
    if process.is_alive():
        process.kill()
    process.join()
