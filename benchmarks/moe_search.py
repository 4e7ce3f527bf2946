"""`autoshard search --by-layer` on mixtures of experts at published scale: the expert, pipeline and
tensor degrees the search chooses for a Mixtral 8x7B shape on 64 H100s and a DeepSeek-V3 shape on
2,048, beside the layouts their trainers published (issue 34, second benchmark).

Each case generates the mixed-precision training step (`generate gpt --style llama --training
--precision bf16-mixed` with the MoE flags: routed experts in groups at a static capacity, top-k,
shared experts, grouped-query attention), runs

    autoshard search G --devices N --topology dgx-h100 --by-layer --pipeline auto --recompute auto
                     --rank-only --time-budget T --max-axes A --jobs 1

in its own process and reads its ranking.json. The degrees come from the roles the report gives each
axis of a stage's sub-mesh (`planning/roles.py`): an axis is the expert axis where it splits the
experts' loop at the expert ops (`expert` for the op class `experts`), a tensor axis where it splits
a model dim of the linear layers, attention or experts, a data axis where it splits their batch.
The pipeline degree is the stage count. A case with a published layout in Megatron-LM's words
(`compare`) also passes `--compare` and records that layout priced with its shardings pinned (expert
parallelism included), its rank and, term by term, how far it is behind the search's answer. Rows are
appended to a JSON-lines file as each case ends; `--table` prints the markdown table of such a file.

    python benchmarks/moe_search.py -o moe.jsonl [--only mixtral-8x7B-64] [--time-budget 180]
    python benchmarks/moe_search.py --table moe.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

COMPUTE_CLASSES = ("attention", "dense", "experts")


@dataclass(frozen=True)
class Case:
    name: str
    gpus: int
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    seq: int
    vocab: int
    batch: int  # global batch, sequences
    experts: int
    top_k: int
    expert_ffn: int
    shared_experts: int
    group_size: int  # tokens routed together (GShard groups), each with its own capacity
    published: str
    budget_s: float
    compare: str | None = None  # the published layout for `search --compare`, when it can be pinned

    def generate_args(self) -> list[str]:
        return ["--style", "llama", "--training", "--precision", "bf16-mixed", "--layers", str(self.layers),
                "--hidden", str(self.hidden), "--heads", str(self.heads), "--kv-heads", str(self.kv_heads),
                "--seq", str(self.seq), "--vocab", str(self.vocab), "--batch", str(self.batch),
                "--moe-experts", str(self.experts), "--moe-top-k", str(self.top_k), "--moe-ffn", str(self.expert_ffn),
                "--moe-shared-experts", str(self.shared_experts), "--moe-capacity-factor", "1.25",
                "--moe-group-size", str(self.group_size)]


CASES = (
    # Mixtral 8x7B (arXiv 2401.04088); global batch 512 of NeMo's pretraining recipe
    # (nemo/collections/llm/recipes/mixtral_8x7b.py: 8 nodes x 8 GPUs, TP 1, PP 4, VP 8, EP 8, SP).
    Case("mixtral-8x7B-64", 64, 32, 4096, 32, 8, 4096, 32000, 512, 8, 2, 14336, 0, 1024,
         "NeMo recipe: tp 1, pp 4 (vp 8), ep 8, dp 16, sp; NeMo 25.04 perf table (GB200): tp 1, pp 1, ep 8", 180.0,
         # NeMo-Framework-Launcher examples/training/mixtral/h100/mixtral_8x7b_bf16.sh: no recomputation set
         "tp=1,pp=4,dp=16,ep=8,interleave=8,micro=1,recompute=none"),
    # DeepSeek-V3 (arXiv 2412.19437): 15,360 sequences of 4k at the end of its batch ramp, PP 16, EP 64
    # (over 8 nodes), ZeRO-1 DP, no TP. MLA approximated by multi-head attention of 128 heads of
    # hidden / heads = 56 features; its first 3 dense layers (ffn 18,432) by MoE layers of the same
    # activated width (8 routed + 1 shared expert of 2,048).
    Case("deepseek-v3-2048", 2048, 61, 7168, 128, 128, 4096, 129280, 15360, 256, 8, 2048, 1, 256,
         "DeepSeek-V3 report: pp 16 (DualPipe), ep 64, tp 1, ZeRO-1 dp", 240.0,
         # 1F1B for DualPipe; it recomputes norms and up-projections and keeps the all-to-alls' inputs:
         # of our modes, `routed` (the routed experts' inputs kept, the rest of the layer recomputed)
         "tp=1,pp=16,dp=128,ep=64,interleave=1,micro=1,recompute=routed"),
    # the same at 16,384 sequences: 15,360 = 15 x 1,024 leaves a microbatch of 15 x 1,024 / M sequences,
    # which a data degree above 1,024 / M does not divide (the search's microbatch counts are powers of 2)
    Case("deepseek-v3-2048-b16384", 2048, 61, 7168, 128, 128, 4096, 129280, 16384, 256, 8, 2048, 1, 256,
         "DeepSeek-V3 report: pp 16 (DualPipe), ep 64, tp 1, ZeRO-1 dp", 240.0),
)


def degrees(sub_mesh: dict) -> dict:
    """Expert, tensor, data and context degrees of a stage's sub-mesh, from its axes' roles."""
    sizes = {a["name"]: a["size"] for a in sub_mesh["axes"]}
    roles = sub_mesh.get("roles") or {}

    def degree(names: tuple[str, ...], classes: tuple[str, ...]) -> int:
        return math.prod(sizes[a] for a, r in roles.items() if any(c in r.get(n, ()) for n in names for c in classes))

    return {"expert": degree(("expert",), ("experts",)), "tensor": degree(("tensor",), COMPUTE_CLASSES),
            "context": degree(("context",), COMPUTE_CLASSES),
            "data": degree(("data", "fully_sharded_data"), COMPUTE_CLASSES),
            "optimizer_expert": degree(("expert",), ("optimizer",))}


def run_case(case: Case, budget_s: float | None, max_axes: int, time_limit_s: float, workdir: Path) -> dict:
    graph = workdir / f"{case.name}.json"
    started = time.perf_counter()
    generated = subprocess.run([sys.executable, "-m", "autoshard.cli.main", "generate", "gpt", *case.generate_args(),
                                "-o", str(graph)], check=True, capture_output=True, text=True)
    generated_s = time.perf_counter() - started
    out = workdir / case.name
    out.mkdir()
    budget = budget_s if budget_s is not None else case.budget_s
    command = [sys.executable, "-m", "autoshard.cli.main", "search", str(graph), "--devices", str(case.gpus),
               "--topology", "dgx-h100", "--by-layer", "--pipeline", "auto", "--recompute", "auto", "--rank-only",
               "--time-budget", str(budget), "--sample-time-limit", str(time_limit_s), "--max-axes", str(max_axes),
               "--jobs", "1", "-o", str(out)] + (["--compare", case.compare] if case.compare else [])
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall_s = time.perf_counter() - started
    row = {"case": case.name, "gpus": case.gpus, "batch": case.batch, "budget_s": budget, "max_axes": max_axes,
           "graph": generated.stdout.strip(), "generate_s": generated_s, "wall_s": wall_s, "published": case.published}
    if done.returncode:
        return row | {"error": done.stderr[-2000:]}
    section = json.loads((out / "ranking.json").read_text())["by_layer"]
    priced = [c for c in section["configurations"] if c.get("outcome") == "priced"]
    with_experts = next((c for c in priced if degrees(c["sub_mesh"])["expert"] > 1), None)
    return row | {"search_s": section["wall_s"], "counts": section["counts"], "gap": section["gap"],
                  "bound_s": section["certified_lower_bound_step_s"], "chosen": _short(section["chosen"]),
                  "best_expert_parallel": _short(with_experts), "priced": len(priced),
                  "compared": _compared(section.get("compared"))}


def _compared(row: dict | None) -> dict | None:
    """The published layout as priced: its words, outcome, rank, step and terms, and how far it
    is behind the chosen configuration term by term."""
    if row is None:
        return None
    keep = ("layout", "outcome", "reason", "behind_chosen")
    return {k: row[k] for k in keep if k in row} | (_short(row) if "stages" in row else {})


def _short(row: dict | None) -> dict | None:
    if row is None:
        return None
    keep = ("rank", "outcome", "stages", "microbatches", "schedule", "virtual_stages_per_stage", "recompute",
            "step_s", "overlapped_step_s", "bubble_fraction", "mfu", "tokens_per_s_per_device", "reason",
            "busiest_stage_s")
    out = {k: row[k] for k in keep if k in row}
    if "sub_mesh" in row:
        out["sub_mesh"] = ",".join(f"{a['name']}={a['size']}" for a in row["sub_mesh"]["axes"])
        out["placement"] = row["sub_mesh"].get("placement")
        out["roles"] = row["sub_mesh"].get("roles")
        out["degrees"] = degrees(row["sub_mesh"])
    if "peak_memory_bytes_per_stage" in row:
        out["peak_gib"] = max(row["peak_memory_bytes_per_stage"]) / 2 ** 30
    return out


def axis_words(roles: dict[str, dict[str, list[str]]]) -> str:
    """Per axis, what it does for attention, the dense layers and the experts: `a0 data` where the
    same for all three, else e.g. `a1 attention tensor, dense context, experts data`."""
    parts = []
    for axis, per_role in roles.items():
        acts = {c: "/".join(r for r, classes in per_role.items() if c in classes) or "replicated"
                for c in COMPUTE_CLASSES}
        same = len(set(acts.values())) == 1
        parts.append(f"{axis} {acts['dense']}" if same else f"{axis} " + ", ".join(f"{c} {a}" for c, a in acts.items()))
    return "; ".join(parts)


def _words(row: dict | None) -> str:
    if row is None:
        return "-"
    schedule = row["schedule"] + (f":{row['virtual_stages_per_stage']}" if row["schedule"] == "interleaved" else "")
    d = row["degrees"]
    return (f"pp {row['stages']} x [{row['sub_mesh']}] (ep {d['expert']}; {axis_words(row['roles'] or {})}), "
            f"M {row['microbatches']}, {schedule}, {row['recompute']}")


def _priced_words(row: dict | None) -> str:
    if row is None:
        return "-"
    if row.get("outcome") != "priced":
        return f"{row.get('layout')}: {row.get('outcome')}"
    peak = f", peak {row['peak_gib']:.1f} GiB" if "peak_gib" in row else ""
    return f"{_words(row)} ({row.get('rank', 'over memory')}, {row['step_s']:.4g}{peak})"


def table(rows: list[dict]) -> str:
    head = ("| case | GPUs | batch | budget s | wall s (search) | keys | solved | unsolved | chosen | step s | MFU "
            "| peak GiB | gap | best with an expert axis (rank, step s) | published "
            "| published priced (rank, step s) |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['case']} | {r['gpus']} | {r['batch']} | {r['budget_s']:g} | {r['wall_s']:.0f} "
                         f"| error: {r['error'][-300:]!r} |")
            continue
        c, e, counts = r["chosen"], r["best_expert_parallel"], r["counts"]
        gap = "-" if r["gap"] is None else f"{100 * r['gap']:.1f}%"
        mfu = "-" if c.get("mfu") is None else f"{100 * c['mfu']:.1f}%"
        expert = "none priced" if e is None else f"{_words(e)} ({e['rank']}, {e['step_s']:.4g})"
        lines.append(f"| {r['case']} | {r['gpus']} | {r['batch']} | {r['budget_s']:g} | {r['wall_s']:.0f} "
                     f"({r['search_s']:.0f}) | {counts['keys']} | {counts['solved']} | {counts['unsolved']} "
                     f"| {_words(c)} | {c['step_s']:.4g} | {mfu} | {c.get('peak_gib', float('nan')):.1f} | {gap} "
                     f"| {expert} | {r['published']} | {_priced_words(r.get('compared'))} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-o", "--output", type=Path, help="JSON-lines file to append results to")
    parser.add_argument("--only", nargs="+", help="cases to run (default: all)")
    parser.add_argument("--time-budget", type=float, help="each search's budget (default: the case's)")
    parser.add_argument("--time-limit", type=float, default=3.0, help="each sample solve's limit (default 3)")
    parser.add_argument("--max-axes", type=int, default=2, help="axes of a stage's sub-mesh (default 2)")
    parser.add_argument("--keep", type=Path, help="keep the graphs and rankings in this directory")
    parser.add_argument("--table", type=Path, help="print the table of a results file and stop")
    args = parser.parse_args()
    if args.table:
        print(table([json.loads(line) for line in args.table.read_text().splitlines() if line.strip()]))
        return
    if args.output is None:
        parser.error("-o/--output is required to run cases")
    rows = []
    with tempfile.TemporaryDirectory(prefix="autoshard-moe-") as scratch:
        workdir = args.keep if args.keep is not None else Path(scratch)
        workdir.mkdir(parents=True, exist_ok=True)
        for case in CASES:
            if args.only and case.name not in args.only:
                continue
            row = run_case(case, args.time_budget, args.max_axes, args.time_limit, workdir)
            rows.append(row)
            print(json.dumps(row)[:400], file=sys.stderr, flush=True)
            with args.output.open("a") as sink:
                sink.write(json.dumps(row) + "\n")
    print(table(rows))


if __name__ == "__main__":
    main()
