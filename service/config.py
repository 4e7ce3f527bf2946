"""Settings of the plan service, read once from `AUTOSHARD_*` environment variables.

`get_settings()` is cached; `create_app(settings)` takes an explicit object instead, which is
how the CLI (`autoshard serve --db ...`) and the tests configure an app.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from autoshard.mesh import MAX_DEVICES


def machine_cores() -> int:
    """The cores this process may run on (fewer than the machine has under a CPU affinity mask)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AUTOSHARD_", frozen=True)

    db: Path = Field(Path("autoshard-plans.sqlite3"), description="SQLite file holding plans and job states")
    workers: int = Field(default_factory=machine_cores, ge=1,
                         description="solves running at the same time, one process each (default: the machine's cores)")
    fast_lane_workers: int = Field(1, ge=0, description="solves of small jobs run besides `workers` while every "
                                                        "worker is busy, so a small job never waits on heavy ones")
    fast_lane_max_size: int = Field(30_000, ge=0, description="the largest job the fast lane takes, by its size "
                                                              "estimate at admission (service/lanes.py, job_size)")
    solver_threads: int = Field(1, ge=1, description="default CP-SAT threads per solve")
    max_solver_threads: int = Field(4, ge=1, description="most CP-SAT threads a request may ask for")
    default_time_limit_s: float = Field(30.0, gt=0)
    max_time_limit_s: float = Field(600.0, gt=0, description="per-request cap on the solver time limit")
    solve_grace_s: float = Field(120.0, gt=0,
                                 description="a solve still running this long after its time limit is killed")
    stop_grace_s: float = Field(10.0, ge=0, description="on shutdown, how long a running solve has to hand over "
                                                        "the best plan it has found (kept with its interrupted job)")
    max_wait_s: float = Field(60.0, ge=0, description="longest `?wait=` a request may hold its connection")
    max_body_bytes: int = Field(32 * 2 ** 20, gt=0)
    max_devices: int = Field(MAX_DEVICES, gt=0, le=MAX_DEVICES,
                             description="most devices a request's mesh may have (the library's limit at most)")
    max_ops: int = Field(20_000, gt=0)
    max_tensors: int = Field(50_000, gt=0)
    max_verify_bytes: int = Field(2 * 2 ** 30, gt=0,
                                  description="host memory a plan's simulation may hold (`verify`: auto or always)")
    start_method: Literal["forkserver", "spawn"] = "forkserver"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
