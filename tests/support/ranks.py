"""Real ranks for the gloo tests: processes forked from the test (they inherit torch already
imported and the programs already exported, which saves most of their start-up) joined within a
fixed time budget, each one ended by its own id if the budget runs out."""

from __future__ import annotations

import socket
import time
from typing import Any, Callable

import torch
import torch.distributed as dist


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(world: int, fn: Callable[..., None], args: tuple[Any, ...], budget_s: float) -> None:
    """Run `fn(rank, *args)` in `world` processes joined in one gloo process group over
    loopback; fail if one raises, or if they are not all done within `budget_s`."""
    port = free_port()
    context = torch.multiprocessing.start_processes(_in_group, args=(world, port, fn, args), nprocs=world,
                                                    join=False, start_method="fork")
    deadline = time.monotonic() + budget_s
    while not context.join(timeout=max(deadline - time.monotonic(), 0.1)):
        if time.monotonic() >= deadline:
            for process in context.processes:
                process.kill()
            raise AssertionError(f"{world} ranks did not finish within {budget_s} s")


def _in_group(rank: int, world: int, port: int, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
    torch.set_num_threads(1)  # the ranks share the machine's cores
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        fn(rank, *args)
    finally:
        dist.destroy_process_group()
