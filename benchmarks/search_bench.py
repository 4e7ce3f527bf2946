"""`autoshard search` on transformer graphs of real width, with local processes and with a local
Ray instance, beside the published hand-chosen layout of the same model on the same devices.

Each case generates the graph (`autoshard generate gpt`), runs the search (bounds, best-bound-first
solves, ranking) once per backend, and plans the published layout alone: its mesh and placement
given, the shardings chosen by the same solver (`make_plan`), so both sides are priced by the same
cost model. That single-mesh plan's time is also the yardstick of the goal (the search within 3x
the time of planning its best candidate alone). Rows are appended to a JSON-lines file as each case
ends; `--table` prints the markdown table of such a file.

    python benchmarks/search_bench.py -o search.jsonl                       # every case, both backends
    python benchmarks/search_bench.py --only 175b-fwd-64 --layers 2 --backends local -o out.jsonl
    python benchmarks/search_bench.py --table search.jsonl
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from autoshard.graph.schema import load_graph
from autoshard.mesh import Mesh
from autoshard.planning.hardware import bind_hardware
from autoshard.planning.make_plan import SolveSettings, make_plan
from autoshard.search.run import SearchOptions, search

WIDTH_175B = ("--hidden", "12288", "--heads", "96", "--seq", "2048", "--batch", "8", "--vocab", "50257")
WIDTH_1_3B = ("--hidden", "2048", "--heads", "16", "--seq", "2048", "--batch", "8", "--vocab", "50257", "--training")

# Published layouts. GPU: Megatron-LM keeps tensor parallelism inside a node (8 GPUs on NVLink) and
# spreads data (and pipeline) parallelism across nodes (Narayanan et al., "Efficient Large-Scale
# Language Model Training on GPU Clusters Using Megatron-LM", SC 2021, sec. 3.3 and Table 1); a model
# the size of GPT-3 1.3B fits on one GPU and is trained data-parallel (their 1.7B row: tensor 1,
# pipeline 1). TPU: MaxText's default is FSDP over every chip of the slice (`ici_fsdp_parallelism:
# -1` in MaxText/configs/base.yml).
MEGATRON_TP8 = "megatron tp=8 in node"
DATA_PARALLEL = "data parallel"
FSDP_ALL = "maxtext fsdp over the slice"


@dataclass(frozen=True)
class Case:
    name: str
    model: tuple[str, ...]
    layers: int
    devices: int
    topology: str
    max_axes: int
    published: str  # which of the layouts above
    published_mesh: str
    published_mapping: dict[str, list[str]]


CASES = (
    Case("175b-fwd-64", WIDTH_175B, 2, 64, "dgx-h100", 3, MEGATRON_TP8, "dp=8,tp=8", {"dp": ["node"], "tp": ["gpu"]}),
    Case("1.3b-train-64", WIDTH_1_3B, 2, 64, "dgx-h100", 3, DATA_PARALLEL, "dp=64", {"dp": ["node", "gpu"]}),
    Case("175b-fwd-256", WIDTH_175B, 2, 256, "dgx-h100", 2, MEGATRON_TP8, "dp=32,tp=8",
         {"dp": ["node"], "tp": ["gpu"]}),
    Case("1.3b-train-256", WIDTH_1_3B, 2, 256, "dgx-h100", 2, DATA_PARALLEL, "dp=256", {"dp": ["node", "gpu"]}),
    Case("175b-fwd-v5p-256", WIDTH_175B, 2, 256, "tpu-v5p", 2, FSDP_ALL, "fsdp=256", {"fsdp": ["x", "y", "z"]}),
    Case("1.3b-train-v5p-256", WIDTH_1_3B, 2, 256, "tpu-v5p", 2, FSDP_ALL, "fsdp=256", {"fsdp": ["x", "y", "z"]}),
)


def generate(case: Case, layers: int, workdir: Path) -> Path:
    graph = workdir / f"{case.name}-{layers}.json"
    subprocess.run([sys.executable, "-m", "autoshard.cli.main", "generate", "gpt", "--layers", str(layers),
                    *case.model, "-o", str(graph)], check=True, capture_output=True)
    return graph


def plan_published(case: Case, document: dict, settings: SolveSettings) -> dict:
    """The published layout planned alone: step time, objective, gap and the time it took."""
    mesh = Mesh.parse(case.published_mesh)
    graph = load_graph(document, mesh)
    started = time.perf_counter()
    slice_shape = (8, 8, 4) if case.topology == "tpu-v5p" else None  # 256 chips: the most compact v5p slice
    hardware = bind_hardware(case.topology, mesh, slice_shape=slice_shape, mapping=case.published_mapping)
    result = make_plan(graph, mesh, hardware, settings)
    return {"layout": case.published, "mesh": case.published_mesh, "placement": case.published_mapping,
            "step_s": result.report.step_s, "objective_s": result.solver["objective_s"], "gap": result.solver["gap"],
            "wall_s": time.perf_counter() - started}


def run_case(case: Case, layers: int, backends: list[str], jobs: int, settings: SolveSettings,
             workdir: Path) -> dict:
    graph = generate(case, layers, workdir)
    document = json.loads(graph.read_text())
    row = {"case": case.name, "layers": layers, "ops": len(document["ops"]), "devices": case.devices,
           "topology": case.topology, "max_axes": case.max_axes, "jobs": jobs,
           "published": plan_published(case, document, settings), "search": {}}
    for backend in backends:
        options = SearchOptions(devices=case.devices, topology=case.topology, settings=settings,
                                max_axes=case.max_axes, jobs=jobs, ray="auto" if backend == "ray" else None)
        started = time.perf_counter()
        result = search(document, options)
        wall_s = time.perf_counter() - started
        best = result.best
        row["search"][backend] = {
            "wall_s": wall_s, "counts": result.counts, "gap": result.gap,
            "best": best.candidate.label, "best_step_s": best.solved["step_s"],
            "best_objective_s": best.solved["objective_ps"] / 1e12, "best_solve_s": best.solved["wall_s"],
            "ranking": [(e.candidate.label, e.outcome, e.solved and e.solved["objective_ps"]) for e in result.entries],
        }
        print(f"{case.name} {backend}: {wall_s:.1f} s, {result.counts}, best {best.candidate.label} "
              f"{best.solved['step_s'] * 1e3:.4g} ms", file=sys.stderr, flush=True)
    runs = list(row["search"].values())
    row["same_ranking"] = all(r["ranking"] == runs[0]["ranking"] for r in runs)
    return row


def table(rows: list[dict]) -> str:
    head = ("| case | ops | devices | topology | max axes | candidates (placements) | pruned | solved | local s "
            "| Ray s | best mesh [placement] | step ms | gap | published layout | its step ms | its plan s "
            "| search / plan of best |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        local, ray = r["search"].get("local"), r["search"].get("ray")
        first = local or ray
        counts, published = first["counts"], r["published"]
        gap = "-" if first["gap"] is None else f"{100 * first['gap']:.2f}%"
        ray_s = f"{ray['wall_s']:.1f}" if ray else "-"
        local_s = f"{local['wall_s']:.1f}" if local else "-"
        lines.append(
            f"| {r['case']} | {r['ops']} | {r['devices']} | {r['topology']} | {r['max_axes']} "
            f"| {counts['candidates']} ({counts['placements']}) | {counts['pruned']} | {counts['solved']} "
            f"| {local_s} | {ray_s} | {first['best']} | {first['best_step_s'] * 1e3:.4g} | {gap} "
            f"| {published['mesh']} ({published['layout']}) | {published['step_s'] * 1e3:.4g} "
            f"| {published['wall_s']:.1f} | {first['wall_s'] / first['best_solve_s']:.1f}x |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-o", "--output", type=Path, help="JSON-lines file to append results to")
    parser.add_argument("--only", nargs="+", choices=[c.name for c in CASES], help="cases to run (default: all)")
    parser.add_argument("--layers", type=int, help="layers of every case's model (default: each case's own)")
    parser.add_argument("--backends", nargs="+", choices=("local", "ray"), default=["local", "ray"])
    parser.add_argument("--jobs", type=int, default=2, help="solves at a time (default 2)")
    parser.add_argument("--time-limit", type=float, default=60.0, help="each solve's time limit (default 60)")
    parser.add_argument("--table", type=Path, help="print the table of a results file and stop")
    args = parser.parse_args()
    if args.table:
        print(table([json.loads(line) for line in args.table.read_text().splitlines() if line.strip()]))
        return
    if args.output is None:
        parser.error("-o/--output is required to run cases")
    settings = SolveSettings(time_limit_s=args.time_limit, workers=1, deterministic=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="autoshard-search-") as scratch:
        for case in CASES:
            if args.only and case.name not in args.only:
                continue
            row = run_case(case, args.layers or case.layers, args.backends, args.jobs, settings, Path(scratch))
            rows.append(row)
            with args.output.open("a") as sink:
                sink.write(json.dumps(row) + "\n")
    print(table(rows))


if __name__ == "__main__":
    main()
