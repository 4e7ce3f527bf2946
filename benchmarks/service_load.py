"""The plan service under load: `autoshard serve --workers 2` (uvicorn) in a child process.

Load: 40 distinct plan requests on the README's MLP (examples/mlp.json; 8 meshes x 5 seeds) sent
at once, each followed until its plan is done; latency is from the request to the first poll that
sees the job ended (polls every 0.05 s). Fairness: a normal plan alone, then the same plan sent
together with a request whose mesh is huge (over the device limit: refused; or a million devices:
planned), each latency measured on its own.

    nice -n 19 python benchmarks/service_load.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from autoshard.client import Client, LocalService, ServiceError

REPO = Path(__file__).resolve().parent.parent
MESHES = ["dp=2", "dp=4", "dp=8", "tp=2", "tp=4", "dp=2,tp=2", "dp=2,tp=4", "dp=4,tp=2"]
SEEDS = range(5)
NORMAL = ("dp=2,tp=4", {"time_limit_s": 10, "seed": 100})
HUGE = ["dp=65536,tp=65536", "dp=1000000"]
POLL_S = 0.05


def timed_plan(url: str, graph: dict, mesh: str, options: dict) -> tuple[float, str]:
    """Seconds from the request until the job is seen ended (or the refusal arrives), and how it ended."""
    with Client(url) as client:
        started = time.perf_counter()
        try:
            job = client.submit(graph, mesh, options=options)
        except ServiceError as error:
            return time.perf_counter() - started, f"HTTP {error.status}"
        job = client.poll(job.id, timeout_s=300, interval_s=POLL_S)
        return time.perf_counter() - started, job.status


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(q * len(ordered) + 0.5) - 1))]


def load(url: str, graph: dict) -> dict:
    requests = [(mesh, {"time_limit_s": 10, "seed": seed}) for mesh in MESHES for seed in SEEDS]
    started = time.perf_counter()
    with ThreadPoolExecutor(len(requests)) as pool:
        outcomes = list(pool.map(lambda r: timed_plan(url, graph, *r), requests))
    wall_s = time.perf_counter() - started
    latencies = [s for s, _ in outcomes]
    statuses = sorted({status for _, status in outcomes})
    return {"requests": len(requests), "statuses": statuses, "wall_s": wall_s,
            "p50_s": statistics.median(latencies), "p95_s": percentile(latencies, 0.95), "max_s": max(latencies)}


def fairness(url: str, graph: dict) -> list[dict]:
    mesh, options = NORMAL
    rows = []
    alone_s, status = timed_plan(url, graph, mesh, options | {"seed": 200})
    rows.append({"case": f"normal plan ({mesh}) alone", "normal_s": alone_s, "normal_status": status})
    for i, huge in enumerate(HUGE):
        with ThreadPoolExecutor(2) as pool:
            big = pool.submit(timed_plan, url, graph, huge, {"time_limit_s": 10, "seed": 300 + i})
            normal = pool.submit(timed_plan, url, graph, mesh, options | {"seed": 201 + i})
            (big_s, big_status), (normal_s, normal_status) = big.result(), normal.result()
        rows.append({"case": f"with {huge}", "huge_s": big_s, "huge_status": big_status,
                     "normal_s": normal_s, "normal_status": normal_status})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="solve workers of the service (default 2)")
    args = parser.parse_args()
    graph = json.loads((REPO / "examples" / "mlp.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        service = LocalService(Path(tmp) / "plans.sqlite3", workers=args.workers)
        service.start()
        try:
            timed_plan(service.url, graph, "dp=2", {"time_limit_s": 10, "seed": 999})  # starts the forkserver
            fair = fairness(service.url, graph)
            loaded = load(service.url, graph)
        finally:
            service.stop()
    print(json.dumps({"fairness": fair, "load": loaded}, indent=1))


if __name__ == "__main__":
    main()
