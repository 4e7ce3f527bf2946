"""Where a search's tasks run: local worker processes (the default, nothing to set up) or a Ray
cluster (`ray`, an optional extra: a local instance started on demand, or an existing cluster).

Both pools take the same calls and run at most `slots` tasks at a time, so a search decides the
same things in the same order on either (see `autoshard.search.run`).
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import socket
from concurrent import futures
from typing import Any, Protocol

from autoshard.errors import AutoshardError, InputError
from autoshard.search.tasks import SearchInputs, run_task

_INPUTS: SearchInputs | None = None  # a local worker's copy of the search's shared inputs


def _remember(inputs: SearchInputs) -> None:
    global _INPUTS
    _INPUTS = inputs


def _run_local(kind: str, candidate: Any, time_limit_s: float, known: Any = None) -> dict[str, Any]:
    assert _INPUTS is not None, "the pool's initializer sets the inputs"
    return run_task(_INPUTS, kind, candidate, time_limit_s, known)


class Pool(Protocol):
    slots: int
    where: str

    def submit(self, kind: str, candidate: Any, time_limit_s: float, known: Any = None) -> Any:
        """Run a task; `known`: the resharding prices a solve starts from (its bound's)."""

    def wait(self, handles: list[Any], timeout_s: float) -> list[Any]:
        """The handles among `handles` that have finished (none if `timeout_s` passes first)."""

    def result(self, handle: Any) -> dict[str, Any]: ...

    def close(self, cancel: list[Any] | None = None) -> None:
        """Release the workers; `cancel`: the handles still running, stopped first."""


class LocalPool:
    """`slots` worker processes, started by forkserver (spawn where there is none): no worker
    inherits the caller's threads or open solver state."""

    def __init__(self, inputs: SearchInputs, slots: int):
        methods = multiprocessing.get_all_start_methods()
        context = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
        self.slots, self.where = slots, f"{slots} local process(es)"
        self._executor = futures.ProcessPoolExecutor(max_workers=slots, mp_context=context, initializer=_remember,
                                                     initargs=(inputs,))

    def submit(self, kind: str, candidate: Any, time_limit_s: float, known: Any = None) -> futures.Future:
        return self._executor.submit(_run_local, kind, candidate, time_limit_s, known)

    def wait(self, handles: list[futures.Future], timeout_s: float) -> list[futures.Future]:
        done, _ = futures.wait(handles, timeout=timeout_s, return_when=futures.FIRST_COMPLETED)
        return [h for h in handles if h in done]

    def result(self, handle: futures.Future) -> dict[str, Any]:
        try:
            return handle.result()
        except futures.process.BrokenProcessPool:
            raise AutoshardError("a worker process of the search died (out of memory, or killed); the search "
                                 "stopped") from None

    def close(self, cancel: list[Any] | None = None) -> None:
        if cancel:
            # A running solve does not look at a flag: stop its process (the executor has no public way).
            processes = list(getattr(self._executor, "_processes", {}).values())
            self._executor.shutdown(wait=False, cancel_futures=True)
            for process in processes:
                process.terminate()
            for process in processes:
                process.join(timeout=10)
        else:
            self._executor.shutdown(wait=True)


RAY_MISSING = "Ray is not installed; install the extra: pip install 'autoshard[ray]'"


def ray_installed() -> bool:
    """Whether Ray can be imported, without importing it (that takes seconds)."""
    return importlib.util.find_spec("ray") is not None


class RayPool:
    """Tasks on Ray: `address` "auto" starts a local instance of `slots` CPUs unless one runs (then
    joins it); any other address joins that cluster. A Ray instance this pool started it also stops."""

    def __init__(self, inputs: SearchInputs, slots: int, address: str):
        try:
            import ray
        except ImportError:
            raise InputError(RAY_MISSING, "ray") from None
        self._ray = ray
        self.slots = slots
        self._started = False
        if not ray.is_initialized():
            try:
                if address == "auto":
                    try:
                        ray.init(address="auto", log_to_driver=False)
                    except ConnectionError:
                        ray.init(num_cpus=slots, include_dashboard=False, log_to_driver=False)
                        self._started = True
                else:
                    _check_reachable(address)
                    ray.init(address=address, log_to_driver=False)
            except ConnectionError as error:
                raise InputError(f"cannot join the Ray cluster at {address!r}: {error}", "ray") from None
        self.where = f"Ray ({'a local instance' if self._started else address}, {slots} task(s) at a time)"
        self._inputs = ray.put(inputs)
        self._remote = ray.remote(num_cpus=1, max_retries=0)(run_task)

    def submit(self, kind: str, candidate: Any, time_limit_s: float, known: Any = None) -> Any:
        return self._remote.remote(self._inputs, kind, candidate, time_limit_s, known)

    def wait(self, handles: list[Any], timeout_s: float) -> list[Any]:
        if not handles:
            return []
        done, _ = self._ray.wait(handles, num_returns=1, timeout=timeout_s)
        if not done:
            return []
        ready = set(self._ray.wait(handles, num_returns=len(handles), timeout=0)[0])
        return [h for h in handles if h in ready]

    def result(self, handle: Any) -> dict[str, Any]:
        return self._ray.get(handle)

    def close(self, cancel: list[Any] | None = None) -> None:
        for handle in cancel or []:
            self._ray.cancel(handle, force=True)
        if self._started:
            self._ray.shutdown()


REACH_TIMEOUT_S = 5.0


def _check_reachable(address: str) -> None:
    """Refuse an address nothing answers at: Ray itself retries it for minutes."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise InputError(f"expected 'auto' or a cluster address host:port (or ray://host:port), got {address!r}",
                         "ray")
    try:
        socket.create_connection((host, int(port)), timeout=REACH_TIMEOUT_S).close()
    except OSError as error:
        raise InputError(f"nothing answers at {address!r} ({error.strerror or error})", "ray") from None


def open_pool(inputs: SearchInputs, slots: int, ray_address: str | None) -> Pool:
    return LocalPool(inputs, slots) if ray_address is None else RayPool(inputs, slots, ray_address)
