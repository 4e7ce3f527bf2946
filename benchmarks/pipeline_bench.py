"""Pipelined training steps at published scale: the search's choice beside the published layout.

For each case: the GPT training step (`autoshard generate gpt --training`), the published layout
priced by `autoshard plan --pipeline` (its fit, step, bubble and peak per stage on our model), and
`autoshard search --pipeline auto` over the same devices (chosen S, M, V, schedule, sub-mesh, step,
bubble, peak per stage, wall time, and the published layout's rank among the configurations it
priced). Each command runs in its own process; its wall time is what a user waits for.

    python benchmarks/pipeline_bench.py -o pipeline.jsonl [--only gpt3-64] [--time-limit 20]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

CLI = [sys.executable, "-m", "autoshard.cli.main"]


@dataclass(frozen=True)
class Case:
    name: str
    model: list[str]  # `autoshard generate gpt` flags
    topology: str
    devices: int
    published_mesh: str  # the axes inside a stage
    stages: int
    microbatches: int
    schedule: str
    search_flags: tuple[str, ...]  # what narrows the search to a size this machine finishes
    source: str  # where the reference layout comes from


GPT3 = ["--layers", "96", "--hidden", "12288", "--heads", "96", "--seq", "2048", "--vocab", "51200"]
CASES = [
    # Narayanan et al. 2021: 175B on 64 A100s, tensor 8 x pipeline 8, interleave 3, micro 1, batch 64
    Case("gpt3-175b-64", GPT3 + ["--batch", "64"], "dgx-a100", 64, "tp=8", 8, 64, "interleaved:3",
         ("--fix", "tp=8", "--max-axes", "2"), "published (Narayanan et al. 2021)"),
    # 1,024 A100s: tensor 8 x pipeline 16 x data 8, micro 1, batch 1,536 (M = 1536 / 8 per replica)
    Case("gpt3-175b-1024", GPT3 + ["--batch", "1536"], "dgx-a100", 1024, "dp=8,tp=8", 16, 192, "1f1b",
         ("--fix", "tp=8", "--max-axes", "2"), "published (Narayanan et al. 2021)"),
    # 1T: 128 layers, hidden 25600, 160 heads on 512: tensor 8 x pipeline 64, micro 1, batch 512
    Case("gpt-1t-512", ["--layers", "128", "--hidden", "25600", "--heads", "160", "--seq", "2048", "--vocab", "51200",
                        "--batch", "512"], "dgx-a100", 512, "tp=8", 64, 512, "1f1b",
         ("--fix", "tp=8", "--max-axes", "1"), "published (Narayanan et al. 2021)"),
    # GPT-3 XL (1.3B) on 16 H100s: fits without a pipeline; the reference is plain data parallelism
    Case("gpt-1.3b-16", ["--layers", "24", "--hidden", "2048", "--heads", "16", "--seq", "2048", "--vocab", "51200",
                         "--batch", "32"], "dgx-h100", 16, "dp=16", 1, 1, "1f1b", (),
         "data parallel only (no published layout)"),
]


def run(command: list[str], log: Path) -> tuple[int, float]:
    started = time.perf_counter()
    with log.open("w") as out:
        code = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT).returncode
    return code, time.perf_counter() - started


def published(case: Case, graph: Path, folder: Path, time_limit_s: float) -> dict:
    """The published layout priced by `plan --pipeline` (S = 1: a plain plan)."""
    out = folder / "published"
    nodes = max(case.devices // 8, 1)
    command = CLI + ["plan", str(graph), "--mesh", case.published_mesh, "--topology", case.topology,
                     "--nodes", str(nodes), "--time-limit", str(time_limit_s), "--verify", "never", "-o", str(out)]
    if case.stages > 1:
        command += ["--pipeline", str(case.stages), "--microbatches", str(case.microbatches),
                    "--schedule", case.schedule]
    code, wall_s = run(command, folder / "published.log")
    row: dict = {"exit": code, "wall_s": wall_s}
    if code == 0:
        document = json.loads((out / "plan.json").read_text())
        section = document.get("pipeline")
        row["phases_s"] = document.get("phases")
        if section:
            row.update(step_s=section["step_s"], bubble_fraction=section["bubble_fraction"],
                       peak_bytes_per_stage=[s["memory"]["peak_bytes"] for s in section["stages"]])
        else:
            row.update(step_s=document["totals"]["step_s"],
                       peak_bytes_per_stage=[document["totals"]["peak_memory_bytes_per_device"]])
    else:
        row["error"] = (folder / "published.log").read_text().strip().splitlines()[-1][:600]
    return row


def searched(case: Case, graph: Path, folder: Path, time_limit_s: float, budget_s: float, stages: str) -> dict:
    out = folder / f"search_{stages}"
    command = CLI + ["search", str(graph), "--devices", str(case.devices), "--topology", case.topology,
                     "--pipeline", stages, "--time-limit", str(time_limit_s), "--time-budget", str(budget_s),
                     "--verify", "never", "--jobs", "1", *case.search_flags, "-o", str(out)]
    log = folder / f"search_{stages}.log"
    code, wall_s = run(command, log)
    row: dict = {"exit": code, "wall_s": wall_s, "flags": list(case.search_flags) + ["--pipeline", stages]}
    if code != 0:
        row["error"] = log.read_text().strip().splitlines()[-1][:600]
        return row
    section = json.loads((out / "ranking.json").read_text())["pipeline"]
    rows = section["configurations"]
    row.update(chosen=section["chosen"], plain_step_s=section["plain_step_s"],
               certified_lower_bound_step_s=section["certified_lower_bound_step_s"],
               priced=sum(r["outcome"] == "priced" for r in rows), configurations=len(rows),
               outcomes={o: sum(r["outcome"] == o for r in rows) for o in {r["outcome"] for r in rows}})
    name, _, chunks = case.schedule.partition(":")
    sizes = sorted(int(axis.split("=")[1]) for axis in case.published_mesh.split(","))
    same = [r for r in rows if (r["stages"], r["microbatches"], r["schedule"], r["virtual_stages_per_stage"])
            == (case.stages, case.microbatches, name, int(chunks or 1))
            and sorted(a["size"] for a in r["sub_mesh"]["axes"]) == sizes]
    row["published_in_search"] = [{k: r.get(k) for k in ("rank", "outcome", "step_s", "reason")} for r in same]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", required=True, help="JSON lines file to append the rows to")
    parser.add_argument("--only", action="append", help="case name (repeatable)")
    parser.add_argument("--time-limit", type=float, default=20.0, help="solver limit per plan, s")
    parser.add_argument("--search-budget", type=float, default=1200.0, help="each search's --time-budget, s")
    parser.add_argument("--skip-search", action="store_true")
    parser.add_argument("--search-pipeline", default="auto",
                        help="search's --pipeline: auto, or the published stage count with `published`")
    parser.add_argument("--skip-published", action="store_true")
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    for case in CASES:
        if args.only and case.name not in args.only:
            continue
        folder = Path(tempfile.mkdtemp(prefix=f"pipeline_{case.name}_"))
        graph = folder / "graph.json"
        subprocess.run(CLI + ["generate", "gpt", "--training", *case.model, "-o", str(graph)], check=True,
                       stdout=subprocess.DEVNULL)
        row = {"case": case.name, "commit": commit, "load": os.getloadavg()[0], "devices": case.devices,
               "topology": case.topology, "time_limit_s": args.time_limit, "folder": str(folder),
               "published_layout": {"source": case.source, "mesh": case.published_mesh, "stages": case.stages,
                                    "microbatches": case.microbatches, "schedule": case.schedule},
               }
        if not args.skip_published:
            row["published"] = published(case, graph, folder, args.time_limit)
            print(json.dumps(row["published"])[:400], flush=True)
        if not args.skip_search:
            stages = str(case.stages) if args.search_pipeline == "published" else args.search_pipeline
            row["search"] = searched(case, graph, folder, args.time_limit, args.search_budget, stages)
            print(json.dumps(row["search"])[:800], flush=True)
        row["load_after"] = os.getloadavg()[0]
        with open(args.output, "a") as out:
            out.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
