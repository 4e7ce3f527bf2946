"""`autoshard search --by-layer` at published scale: the whole configuration space of a 22B-1T
model on 8-3,072 A100s, within a time budget, beside the published layout priced by the same model.

Cases: each model and cluster of `published_runs.csv` (its faster row's layout, selective
recomputation with sequence parallelism, is the one compared),
GPT-3 175B on 1,024 GPUs (global batch 1,536; published tp 8, pp 16, dp 8, micro 1) and the 1T model
on 3,072 (global batch 3,072; published tp 8, pp 64, dp 6, micro 1). Each case generates the
Megatron-style mixed-precision training step (`generate gpt --style megatron --training --precision
bf16-mixed`, one sample per data replica per microbatch), runs

    autoshard search G --devices N --topology dgx-a100 --by-layer --pipeline auto --recompute auto
                     --rank-only --time-budget T --compare PUBLISHED --max-axes A

in its own process, and reads its ranking.json: wall time, keys (stage count, sub-mesh, microbatches,
recomputation), formulations, solved and pruned, the best configuration, its step, the certified gap
over the whole space, and the published layout's step, memory fit and rank. Rows are appended to a
JSON-lines file as each case ends; `--table` prints the markdown table of such a file.

    python benchmarks/scale_search.py -o scale.jsonl [--only gpt3-175B-1024] [--time-budget 60]
    python benchmarks/scale_search.py --table scale.jsonl
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

CSV = Path(__file__).with_name("published_runs.csv")


@dataclass(frozen=True)
class Case:
    name: str
    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    gpus: int
    batch: int
    published: str  # `--compare` text
    budget_s: float  # the goal where it sets one


def cases() -> list[Case]:
    found, seen = [], set()
    with CSV.open(newline="") as handle:
        for row in csv.DictReader(handle):
            key = (row["model"], row["gpus"])
            if key in seen or row["recompute"] != "selective":  # the faster published run of each model
                continue
            seen.add(key)
            published = (f"tp={row['tp']},pp={row['pp']},dp={row['dp']},interleave={row['interleave']},"
                         f"micro={row['micro_batch']},recompute={row['recompute']},"
                         f"sp={1 if row['seq_parallel'] == 'yes' else 0}")
            found.append(Case(f"{row['model']}-{row['gpus']}", int(row["layers"]), int(row["hidden"]),
                              int(row["heads"]), int(row["seq"]), int(row["vocab"]), int(row["gpus"]),
                              int(row["global_batch"]), published, 120.0))
    found.append(Case("gpt3-175B-1024", 96, 12288, 96, 2048, 51200, 1024, 1536,
                      "tp=8,pp=16,dp=8,interleave=1,micro=1,recompute=selective,sp=1", 60.0))
    found.append(Case("megatron-1T-3072", 128, 25600, 160, 2048, 51200, 3072, 3072,
                      "tp=8,pp=64,dp=6,interleave=1,micro=1,recompute=selective,sp=1", 300.0))
    return found


def run_case(case: Case, budget_s: float | None, max_axes: int, time_limit_s: float, workdir: Path) -> dict:
    graph = workdir / f"{case.name}.json"
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "autoshard.cli.main", "generate", "gpt", "--style", "megatron",
                    "--training", "--precision", "bf16-mixed", "--layers", str(case.layers), "--hidden",
                    str(case.hidden), "--heads", str(case.heads), "--seq", str(case.seq), "--vocab", str(case.vocab),
                    "--batch", str(case.batch), "-o", str(graph)], check=True, capture_output=True)
    generated_s = time.perf_counter() - started
    out = workdir / case.name
    out.mkdir()
    budget = budget_s if budget_s is not None else case.budget_s
    command = [sys.executable, "-m", "autoshard.cli.main", "search", str(graph), "--devices", str(case.gpus),
               "--topology", "dgx-a100", "--by-layer", "--pipeline", "auto", "--recompute", "auto", "--rank-only",
               "--time-budget", str(budget), "--sample-time-limit", str(time_limit_s), "--max-axes", str(max_axes),
               "--jobs", "2", "--compare", case.published, "-o", str(out)]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall_s = time.perf_counter() - started
    if done.returncode:
        return {"case": case.name, "error": done.stderr[-2000:], "wall_s": wall_s}
    section = json.loads((out / "ranking.json").read_text())["by_layer"]
    return {"case": case.name, "gpus": case.gpus, "layers": case.layers, "budget_s": budget, "max_axes": max_axes,
            "generate_s": generated_s, "wall_s": wall_s, "search_s": section["wall_s"], "counts": section["counts"],
            "gap": section["gap"], "bound_s": section["certified_lower_bound_step_s"],
            "chosen": _short(section["chosen"]), "compared": _short(section.get("compared")),
            "published": case.published}


def _short(row: dict | None) -> dict | None:
    if row is None:
        return None
    keep = ("rank", "outcome", "stages", "microbatches", "schedule", "virtual_stages_per_stage", "recompute",
            "step_s", "overlapped_step_s", "bubble_fraction", "mfu", "tokens_per_s_per_device", "layout", "reason",
            "busiest_stage_s", "behind_chosen")
    out = {k: row[k] for k in keep if k in row}
    if "sub_mesh" in row:
        out["sub_mesh"] = ",".join(f"{a['name']}={a['size']}" for a in row["sub_mesh"]["axes"])
        out["roles"] = row["sub_mesh"].get("roles")
    if "peak_memory_bytes_per_stage" in row:
        out["peak_gib"] = max(row["peak_memory_bytes_per_stage"]) / 2 ** 30
    return out


def _words(row: dict | None) -> str:
    if row is None:
        return "-"
    schedule = row["schedule"] + (f":{row['virtual_stages_per_stage']}" if row["schedule"] == "interleaved" else "")
    return f"S {row['stages']} x [{row['sub_mesh']}], M {row['microbatches']}, {schedule}, {row['recompute']}"


def table(rows: list[dict]) -> str:
    head = ("| case | GPUs | budget s | wall s (search) | keys | formulations | solved | pruned | unsolved | best "
            "configuration | step s | MFU | gap | published | its step s | its peak GiB | its rank |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['case']} | error: {r['error'][-200:]!r} |")
            continue
        c, p, counts = r["chosen"], r["compared"] or {}, r["counts"]
        gap = "-" if r["gap"] is None else f"{100 * r['gap']:.1f}%"
        mfu = "-" if not c or c.get("mfu") is None else f"{100 * c['mfu']:.1f}%"
        its = f"{p['step_s']:.4g}" if "step_s" in p else p.get("outcome", "-")
        lines.append(f"| {r['case']} | {r['gpus']} | {r['budget_s']:g} | {r['wall_s']:.0f} ({r['search_s']:.0f}) "
                     f"| {counts['keys']} | {counts['formulations']} | {counts['solved']} | {counts['pruned']} "
                     f"| {counts['unsolved']} | {_words(c)} | {c['step_s']:.4g} | {mfu} | {gap} | {r['published']} "
                     f"| {its} | {p.get('peak_gib', float('nan')):.1f} | {p.get('rank', '-')} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-o", "--output", type=Path, help="JSON-lines file to append results to")
    parser.add_argument("--only", nargs="+", help="cases to run (default: all)")
    parser.add_argument("--time-budget", type=float, help="each search's budget (default: the case's goal, or 120 s)")
    parser.add_argument("--time-limit", type=float, default=3.0, help="each sample solve's limit (default 3)")
    parser.add_argument("--max-axes", type=int, default=2, help="axes of a stage's sub-mesh (default 2)")
    parser.add_argument("--table", type=Path, help="print the table of a results file and stop")
    args = parser.parse_args()
    if args.table:
        print(table([json.loads(line) for line in args.table.read_text().splitlines() if line.strip()]))
        return
    if args.output is None:
        parser.error("-o/--output is required to run cases")
    rows = []
    with tempfile.TemporaryDirectory(prefix="autoshard-scale-") as scratch:
        for case in cases():
            if args.only and case.name not in args.only:
                continue
            row = run_case(case, args.time_budget, args.max_axes, args.time_limit, Path(scratch))
            rows.append(row)
            print(json.dumps(row)[:400], file=sys.stderr, flush=True)
            with args.output.open("a") as sink:
                sink.write(json.dumps(row) + "\n")
    print(table(rows))


if __name__ == "__main__":
    main()
