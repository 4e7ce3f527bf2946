"""The whole `autoshard plan` command, phase by phase, on models of real size.

Each case generates a transformer graph (`autoshard generate gpt`), then runs the command a user
runs, `autoshard plan GRAPH --mesh ... --topology ... --time-limit 60 --emit annotated,partitioned
-o DIR`, in a fresh process, and reads the phase times and peak memory it records in `plan.json`.
The start-up column is the wall time outside every phase: the interpreter and its imports.
Results are appended to a JSON-lines file as each case ends (a stopped run keeps what it measured);
`--table` prints the markdown table of such a file.

    python benchmarks/end_to_end.py -o benchmarks/end_to_end.jsonl            # every case
    python benchmarks/end_to_end.py --only 22b-tp8 --layers 16 32 -o out.jsonl
    python benchmarks/end_to_end.py --table benchmarks/end_to_end.jsonl
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

PHASES = ("load", "formulate", "solve", "pricing", "partition", "collective_optimizations", "verification",
          "ir_emission", "writing")
WIDTH_22B = ("--hidden", "6144", "--heads", "64", "--seq", "2048", "--batch", "4", "--vocab", "51200", "--training")
WIDTH_175B = ("--hidden", "12288", "--heads", "96", "--seq", "2048", "--batch", "8", "--vocab", "50257")
WIDTH_1_3B = ("--hidden", "2048", "--heads", "16", "--seq", "2048", "--batch", "8", "--vocab", "50257", "--training")


@dataclass(frozen=True)
class Case:
    name: str
    model: tuple[str, ...]  # `autoshard generate gpt` flags, without --layers
    mesh: str
    placement: tuple[str, ...]  # --topology and where the mesh lies


# The 22B-width series on tp=8 runs on B200s: 96 such layers with Adam need about 103 GiB per
# device at best, over an A100's or H100's 80 GB. `22b-tp8-a100` is the 48-layer step on A100s.
CASES = (
    Case("22b-tp8", WIDTH_22B, "tp=8", ("--topology", "dgx-b200")),
    Case("22b-tp8-a100", WIDTH_22B, "tp=8", ("--topology", "dgx-a100")),
    Case("22b-dp4tp8", WIDTH_22B, "dp=4,tp=8", ("--topology", "dgx-a100", "--nodes", "4")),
    Case("175b-fwd-3d", WIDTH_175B, "pp=2,dp=4,tp=8", ("--topology", "dgx-h100", "--nodes", "8")),
    Case("1.3b-3d", WIDTH_1_3B, "pp=2,dp=4,tp=8", ("--topology", "dgx-h100", "--nodes", "8")),
)
DEFAULT_LAYERS = {"22b-tp8": (4, 8, 16, 32, 48, 64, 96), "22b-tp8-a100": (48,), "22b-dp4tp8": (4, 8, 16, 32, 48, 64, 96),
                  "175b-fwd-3d": (96,), "1.3b-3d": (96,)}


def run_case(case: Case, layers: int, time_limit_s: float, workdir: Path) -> dict | None:
    """The case's measurements, or None (and the reason on stderr) if the command failed."""
    graph, out = workdir / f"{case.name}-{layers}.json", workdir / f"{case.name}-{layers}"
    autoshard = [sys.executable, "-m", "autoshard.cli.main"]
    subprocess.run(autoshard + ["generate", "gpt", "--layers", str(layers), *case.model, "-o", str(graph)],
                   check=True, capture_output=True)
    command = autoshard + ["plan", str(graph), "--mesh", case.mesh, *case.placement, "--time-limit", str(time_limit_s),
                           "--emit", "annotated,partitioned", "-o", str(out)]
    start = time.perf_counter()
    finished = subprocess.run(command, capture_output=True, text=True)
    wall_s = time.perf_counter() - start
    if finished.returncode not in (0, 1):  # 1: a verification failed, still a finished plan
        last = finished.stderr.strip().splitlines()[-1:] or [""]
        print(f"{case.name} at {layers} layers exited {finished.returncode}: {last[0]}", file=sys.stderr, flush=True)
        return None
    document = json.loads((out / "plan.json").read_text())
    phases = {name: p["wall_s"] for name, p in document["phases"].items()}
    solve_s = phases.get("solve", 0.0)
    return {"case": case.name, "layers": layers, "mesh": case.mesh, "ops": len(json.loads(graph.read_text())["ops"]),
            "wall_s": wall_s, "phases_s": phases,
            "peak_rss_bytes": max(p["peak_rss_bytes"] for p in document["phases"].values()),
            "non_solver_s": wall_s - solve_s, "gap": document["solver"].get("gap"),
            "status": document["solver"].get("status"), "ir_bytes": sum(f.stat().st_size for f in out.glob("*.mlir"))}


def table(rows: list[dict]) -> str:
    head = ("| case | layers | ops | " + " | ".join(PHASES) + " | start-up | wall s | non-solver s | non-solver / wall "
            "| peak RSS GiB | gap |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        cells = [f"{r['phases_s'].get(p, 0.0):.1f}" for p in PHASES] + [f"{r['wall_s'] - sum(r['phases_s'].values()):.1f}"]
        gap = "-" if r["gap"] is None else f"{100 * r['gap']:.2f}%"
        lines.append(f"| {r['case']} | {r['layers']} | {r['ops']} | " + " | ".join(cells) +
                     f" | {r['wall_s']:.1f} | {r['non_solver_s']:.1f} | {r['non_solver_s'] / r['wall_s']:.2f} "
                     f"| {r['peak_rss_bytes'] / 2**30:.2f} | {gap} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-o", "--output", type=Path, help="JSON-lines file to append results to")
    parser.add_argument("--only", nargs="+", choices=[c.name for c in CASES], help="cases to run (default: all)")
    parser.add_argument("--layers", nargs="+", type=int, help="layer counts (default: each case's own)")
    parser.add_argument("--time-limit", type=float, default=60.0, help="solver seconds (default 60)")
    parser.add_argument("--table", type=Path, help="print the table of a results file and stop")
    args = parser.parse_args()
    if args.table:
        print(table([json.loads(line) for line in args.table.read_text().splitlines() if line.strip()]))
        return
    if args.output is None:
        parser.error("-o/--output is required to run cases")
    rows = []
    with tempfile.TemporaryDirectory(prefix="autoshard-e2e-") as scratch:
        for case in CASES:
            if args.only and case.name not in args.only:
                continue
            for layers in args.layers or DEFAULT_LAYERS[case.name]:
                row = run_case(case, layers, args.time_limit, Path(scratch))
                if row is None:
                    continue
                rows.append(row)
                with args.output.open("a") as sink:
                    sink.write(json.dumps(row) + "\n")
                print(f"{case.name} {layers} layers: {row['wall_s']:.1f} s wall, {row['non_solver_s']:.1f} s "
                      f"outside the solver, {row['peak_rss_bytes'] / 2**30:.2f} GiB", file=sys.stderr, flush=True)
    print(table(rows))


if __name__ == "__main__":
    main()
