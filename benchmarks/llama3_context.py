"""Llama 3 8B's training step on 8 DGX H100 GPUs at 32k-256k tokens: the layout `search --by-layer` chooses,
and torchtitan's measured FSDP x CP layouts priced by the same model with what defines them pinned.

torchtitan's run (benchmarks/llama3_h100_202412_torchtitan.md in pytorch/torchtitan, table 2: Llama 3.1 8B,
8 H100s, local batch 1, full activation checkpointing, torch.compile and Float8): FSDP 8 x CP 1 at 32,768
tokens, 4 x 2 at 65,536, 2 x 4 at 131,072 and 1 x 8 at 262,144, 3,890 / 2,540 / 1,071 / 548 tokens/s per GPU.
A step holds one sequence per FSDP rank, so 262,144 tokens at every length (batch 8, 4, 2, 1).

A pinned layout `fsdp=f,cp=c` (`torchtitan_constraints`) requires:
- every parameter, its Adam moments and its f32 master split on dim 0 over fsdp and cp together
  (torchtitan shards over the flattened `dp_shard_cp` mesh). The gradients are left free: a pin holds a
  value as its op produces it, and a weight gradient is produced partial over the batch and sequence and
  reduce-scattered to the optimizer's shards (pinned split, the gradient's op would have to produce it split
  on its rows: the activation gradients gathered whole, 0.57 s against 0.34 s for one layer at 32k);
- the token ids and labels, the embedding, every layer's [batch, sequence, features] values (norms,
  projections, the MLP, residuals), the final norm and the logits split on the batch over fsdp and on the
  sequence over cp, their feature dims whole (so weights are gathered per layer, never split as tensor
  parallelism);
- attention's queries and output split on the sequence over cp and its keys and values (at query heads,
  after the grouped-query repeat) whole over cp: the all-gather realisation; with cp > 1 the graph is
  generated in the load-balanced causal layout over cp (`--balanced-over c`).
The solver chooses the rest (where K/V are gathered, the gradients' values, the loss, the optimizer's
temporaries) and the recomputation is full, as in the run. Every solve is a three-layer sample
(`search --by-layer --rank-only`) priced for 32 layers.

    python benchmarks/llama3_context.py -o llama3_context.jsonl [--lengths 32768 65536] [--grid] \\
        [--searches contiguous balanced] [--no-pinned]
    python benchmarks/llama3_context.py --table llama3_context.jsonl
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
AUTOSHARD = [sys.executable, "-c", "import sys; from autoshard.cli.main import main; sys.exit(main())"]
TOKENS = 262_144  # per step: one sequence per FSDP rank
LENGTHS = (32_768, 65_536, 131_072, 262_144)
# length -> (fsdp, cp, measured tokens/s per GPU, measured GiB), torchtitan's table 2
MEASURED = {32_768: (8, 1, 3_890, 83.9), 65_536: (4, 2, 2_540, 84.2), 131_072: (2, 4, 1_071, 84.0),
            262_144: (1, 8, 548, 84.5)}
SHAPE = ["--style", "llama", "--layers", "32", "--hidden", "4096", "--heads", "32", "--kv-heads", "8",
         "--ffn", "14336", "--vocab", "128256", "--training", "--precision", "bf16-mixed"]
HBM_BYTES = 80e9  # an H100 SXM's 80 GB
SEQUENCE_VALUES = ("attn_norm", "attn.q", "attn.k", "attn.v", "attn.q.split", "attn.k.split", "attn.v.split",
                   "attn.merge", "attn.merged", "attn.out", "attn_residual", "mlp_norm", "mlp.gate", "mlp.silu",
                   "mlp.up", "mlp.glu", "mlp.down", "mlp_residual")
QUERY_SPLIT = ("attn.q.heads", "attn.sdpa")  # [batch, heads, sequence, head dim]
KEYS_WHOLE = ("attn.k.grouped", "attn.v.grouped")


def run_autoshard(args: list[str], log: Path) -> float:
    start = time.monotonic()
    with log.open("w") as out:
        done = subprocess.run(AUTOSHARD + args, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    if done.returncode:
        raise RuntimeError(f"autoshard {' '.join(args)} failed; see {log}")
    return time.monotonic() - start


def generate(length: int, balanced_over: int, path: Path) -> dict[str, Any]:
    args = ["generate", "gpt", *SHAPE, "--seq", str(length), "--batch", str(TOKENS // length), "-o", str(path)]
    if balanced_over > 1:
        args += ["--balanced-over", str(balanced_over)]
    run_autoshard(args, path.with_suffix(".log"))
    return json.loads(path.read_text())


def torchtitan_constraints(document: dict[str, Any], fsdp: int, cp: int) -> list[dict[str, Any]]:
    """The required shardings of FSDP f x CP c (the module docstring) on a `generate gpt --style llama`
    training step, over mesh axes named fsdp and cp (an axis of size 1 absent)."""
    batch = ["fsdp"] if fsdp > 1 else []
    sequence = ["cp"] if cp > 1 else []
    shard = batch + sequence
    tensors = document["tensors"]
    pinned: dict[str, list[list[str]]] = {}
    for name, tensor in tensors.items():
        if tensor.get("role") == "parameter" and not name.startswith("adam."):
            rank = len(tensor["shape"])
            for held in (name, f"adam.{name}.m", f"adam.{name}.v", f"adam.{name}.master"):
                if held in tensors:
                    pinned[held] = [shard] + [[]] * (rank - 1)
    for name, tensor in tensors.items():
        local, rank = name.split(".", 1)[-1], len(tensor["shape"])
        in_layer = name.startswith("layer")
        if name in ("ids", "labels"):
            pinned[name] = [batch, sequence]
        elif name in ("embed", "final_norm", "logits") or (in_layer and local in SEQUENCE_VALUES):
            pinned[name] = [batch, sequence] + [[]] * (rank - 2)
        elif in_layer and local in QUERY_SPLIT:
            pinned[name] = [batch, [], sequence, []]
        elif in_layer and local in KEYS_WHOLE:
            pinned[name] = [batch, [], [], []]
    return [{"tensor": name, "split_axes": axes, "required": True} for name, axes in pinned.items()]


def search(graph: Path, out: Path, fix: str | None, sample_time_limit: float) -> tuple[dict[str, Any], float]:
    args = ["search", str(graph), "--devices", "8", "--topology", "dgx-h100", "--by-layer", "--recompute", "full",
            "--rank-only", "--jobs", "1", "--sample-time-limit", str(sample_time_limit), "-o", str(out)]
    if fix:
        args += ["--fix", fix, "--max-axes", str(fix.count(",") + 1)]
    seconds = run_autoshard(args, out.with_suffix(".log"))
    return json.loads((out / "ranking.json").read_text())["by_layer"], seconds


def context_axes(sub_mesh: dict[str, Any]) -> list[str]:
    """`name=size` of the axes whose role in attention is context (the sequence split)."""
    sizes = {axis["name"]: axis["size"] for axis in sub_mesh["axes"]}
    return [f"{name}={sizes[name]}" for name, roles in sub_mesh["roles"].items()
            if "attention" in roles.get("context", [])]


def attention_roles(roles: dict[str, dict[str, list[str]]], sizes: dict[str, int]) -> str:
    """Each axis's role in attention, e.g. `a0=4 data, a1=2 tensor`."""
    return ", ".join(f"{axis}={sizes[axis]} " + "/".join(role for role, classes in by_role.items()
                                                          if "attention" in classes)
                     for axis, by_role in roles.items())


def summary(ranking: dict[str, Any]) -> dict[str, Any]:
    chosen = ranking.get("chosen")
    if not chosen:
        over = [c for c in ranking["configurations"] if c.get("step_s") is not None]
        if not over:
            return {"outcome": "no configuration priced"}
        chosen = min(over, key=lambda c: c["step_s"])
    peak = max(chosen["peak_memory_bytes_per_stage"])
    mesh = ",".join(f"{a['name']}={a['size']}" for a in chosen["sub_mesh"]["axes"])
    return {"outcome": chosen["outcome"], "mesh": mesh, "microbatches": chosen["microbatches"],
            "roles": chosen["sub_mesh"]["roles"], "context": context_axes(chosen["sub_mesh"]),
            "attention": attention_roles(chosen["sub_mesh"]["roles"],
                                         {a["name"]: a["size"] for a in chosen["sub_mesh"]["axes"]}),
            "step_s": chosen["step_s"], "tokens_per_s_per_gpu": chosen["tokens_per_s_per_device"],
            "mfu": chosen.get("mfu"), "peak_gib": peak / 2**30, "fits_80gb": peak <= HBM_BYTES,
            "bound_step_s": ranking.get("certified_lower_bound_step_s")}


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown: one line per length, torchtitan's layout pinned beside the search's choice."""
    lines = ["| tokens | torchtitan FSDP x CP | measured tok/s/GPU (GiB, 96 GB H100) | pinned: step s "
             "| pinned: tok/s/GPU | pinned: peak GiB (80 GB fit) | pinned / measured "
             "| search: mesh, roles in attention | search: step s | search: tok/s/GPU | search: peak GiB "
             "| search / measured |", "|" + " --- |" * 12]
    for length in sorted({row["length"] for row in rows}):
        at = [row for row in rows if row["length"] == length]
        pinned = next((row for row in at if row["layout"] == row["measured_layout"]), None)
        found = next((row for row in at if row["layout"] == "search"), None)
        first = at[0]
        measured = first["measured_tokens_per_s_per_gpu"]
        cells = [f"{length:,}", (first["measured_layout"] or "-").replace("fsdp ", "").replace(" x cp ", " x "),
                 f"{measured:,} ({first['measured_gib']})" if measured else "-"]
        for row, keys in ((pinned, ("step", "tok", "mem", "ratio")), (found, ("roles", "step", "tok", "mem", "ratio"))):
            if row is None or "step_s" not in row:
                cells += ["-"] * len(keys)
                continue
            values = {"roles": f"{row['mesh']}: {row.get('attention', '')}", "step": f"{row['step_s']:.2f}",
                      "tok": f"{row['tokens_per_s_per_gpu']:,.0f}",
                      "mem": f"{row['peak_gib']:.1f} ({'fits' if row['fits_80gb'] else 'over'})",
                      "ratio": f"{row['predicted_over_measured']:.2f}" if measured else "-"}
            cells += [values[key] for key in keys]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def all_rows_table(rows: list[dict[str, Any]]) -> str:
    """Markdown: every solve, by length (pinned layouts and searches alike)."""
    lines = ["| tokens | layout | sequence stored | mesh: roles in attention | step s | tok/s/GPU | peak GiB "
             "| over the length's best |", "|" + " --- |" * 8]
    for length in sorted({row["length"] for row in rows}):
        at = sorted((row for row in rows if row["length"] == length and "step_s" in row), key=lambda r: r["step_s"])
        seen = set()
        for row in at:
            if (row["layout"], row["balanced_over"]) in seen:
                continue
            seen.add((row["layout"], row["balanced_over"]))
            stored = "own order" if row["balanced_over"] <= 1 else f"balanced over {row['balanced_over']}"
            lines.append(f"| {length:,} | {row['layout']} | {stored} | {row['mesh']}: {row.get('attention', '')} "
                         f"| {row['step_s']:.2f} | {row['tokens_per_s_per_gpu']:,.0f} | {row['peak_gib']:.1f} "
                         f"| {row['step_s'] / at[0]['step_s'] - 1:+.1%} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-o", "--output", type=Path, help="JSON lines, one per solve (appended)")
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    parser.add_argument("--work", type=Path, default=Path("llama3_context_work"), help="graphs and rankings")
    parser.add_argument("--grid", action="store_true",
                        help="also every FSDP x CP layout whose FSDP degree divides the length's batch")
    parser.add_argument("--no-pinned", action="store_true", help="no pinned layout, only the searches")
    parser.add_argument("--searches", nargs="*", choices=("contiguous", "balanced"), default=["contiguous"],
                        help="search the graph in the sequence's own order and/or in the load-balanced layout "
                             "over the measured run's CP degree (default: contiguous; none: only the pinned)")
    parser.add_argument("--table", type=Path, nargs="+", help="print the markdown table of these JSON lines and stop")
    parser.add_argument("--sample-time-limit", type=float, default=3.0, help="the search's sample solves (s)")
    parser.add_argument("--pinned-time-limit", type=float, default=60.0,
                        help="a pinned layout's sample solve (s; one key each, so a longer limit)")
    args = parser.parse_args()
    if args.table:
        rows = [json.loads(line) for path in args.table for line in path.read_text().splitlines() if line.strip()]
        for row in rows:  # rows written before the roles in attention were summarised
            if "roles" in row and "attention" not in row:
                sizes = dict(part.split("=") for part in row["mesh"].split(","))
                row["attention"] = attention_roles(row["roles"], sizes)
        print(table(rows) + "\n\n" + all_rows_table(rows))
        return
    if args.output is None:
        parser.error("-o is required unless --table is given")
    args.work = args.work.resolve()
    args.work.mkdir(parents=True, exist_ok=True)
    for length in args.lengths:
        batch = TOKENS // length
        if TOKENS % length:
            parser.error(f"--lengths: {length} does not divide the step's {TOKENS:,} tokens")
        # a length torchtitan did not measure is searched only (its pinned layout is unknown)
        fsdp, cp, measured, measured_gib = MEASURED.get(length, (0, 0, None, None))
        layouts = [(fsdp, cp)] if measured else []
        if args.grid:
            layouts += [(f, 8 // f) for f in (8, 4, 2, 1) if f != fsdp and batch % f == 0]
        runs = [] if args.no_pinned else [(f, c, c) for f, c in layouts]  # (fsdp, cp, balanced over); 0: search
        runs += [(0, 0, 1)] if "contiguous" in args.searches else []
        runs += [(0, 0, cp)] if "balanced" in args.searches and cp > 1 else []
        for f, c, balanced in runs:
            fix = ",".join(f"{name}={size}" for name, size in (("fsdp", f), ("cp", c)) if size > 1) or None
            label = f"fsdp {f} x cp {c}" if fix else "search" if balanced == 1 else f"search, balanced over {balanced}"
            stem = f"{length // 1024}k_" + (fix.replace("=", "").replace(",", "_") if fix else f"search_b{balanced}")
            graph = args.work / f"{stem}.json"
            document = generate(length, balanced, graph)
            if fix:
                document["constraints"] = torchtitan_constraints(document, f, c)
                graph.write_text(json.dumps(document))
            limit = args.pinned_time_limit if fix else args.sample_time_limit
            ranking, seconds = search(graph, args.work / stem, fix, limit)
            row = {"length": length, "batch": batch, "layout": label, "balanced_over": balanced,
                   "measured_layout": f"fsdp {fsdp} x cp {cp}" if measured else None,
                   "measured_tokens_per_s_per_gpu": measured,
                   "measured_gib": measured_gib, "search_s": round(seconds, 1), **summary(ranking)}
            if "tokens_per_s_per_gpu" in row and measured:
                row["predicted_over_measured"] = row["tokens_per_s_per_gpu"] / measured
            with args.output.open("a") as out:
                out.write(json.dumps(row) + "\n")
            print(json.dumps({k: v for k, v in row.items() if k != "roles"}), flush=True)


if __name__ == "__main__":
    main()
