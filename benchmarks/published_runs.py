"""Published training runs priced by autoshard's model, beside their measured step times.

Each row of the CSV (columns `COLUMNS`: the model's shape, the GPU count and kind, tensor /
pipeline / data degrees, interleave, global and micro batch, recomputation, sequence parallelism,
and the measured seconds per step) is priced as a fixed layout, with nothing fitted per row:

1. the Megatron-LM layer (`generate gpt --style megatron`), three layers of it with the embedding,
   LM head and loss, as a mixed-precision training step (`bf16-mixed`) on one microbatch of every
   data replica, recomputed as the row says (`plan --recompute`);
2. Megatron's layout pinned on the mesh inside a stage (`dp=d,tp=t`): column- then row-parallel
   projections, heads and MLP features over tp, norms and residuals whole or split on the sequence
   (`models.layouts.megatron_constraints`), the batch over dp; the solver places the rest (the
   optimizer state: the distributed optimizer where it pays);
3. the seconds of each op (compute and the communication into it) from that plan, summed per
   layer position and kind (forward, backward, optimizer): the middle layer is a layer, the first
   and last carry the embedding and the head and loss besides;
4. the schedule simulated event by event (`autoshard.pipeline`): 1F1B, or interleaved with the
   row's chunks, each chunk its layers' seconds, the activations and gradients between stages
   sent over the machine's stage axis, the optimizer (and the gradient reduction over dp) after
   each stage's last backward.

Memory per GPU, of the fullest stage: the state of its layers (bf16 weights, f32 main gradients,
f32 master weights and Adam moments, as planned; the embedding's and the head's with the stages
holding them) and the activations of the microbatches it holds at its peak under the schedule
(not the working set of one layer's recomputation).

With `--search`, per model and cluster, every layout Megatron-LM could run it in (`layouts`) is
priced the same way and the fastest that fits is set beside the published ones, with their rank.

    python benchmarks/published_runs.py [--csv FILE] [--json] [--only MODEL] [--time-limit 20] [--search]
"""

from __future__ import annotations

import argparse
import csv
import itertools
import json
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cost_models import load_profile

from autoshard.errors import AutoshardError, InputError, Problem
from autoshard.graph.recompute import MODES, with_recomputation
from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.models import GPTConfig, gpt
from autoshard.models.layouts import megatron_constraints
from autoshard.models.training import training_precision
from autoshard.pipeline import simulate_pipeline
from autoshard.pipeline.schedules import activation_peaks, stage_orders
from autoshard.planning.costs import tensor_bytes
from autoshard.planning.hardware import bind_hardware
from autoshard.planning.kept import kept_activation_bytes
from autoshard.planning.make_plan import PlanResult, SolveSettings, make_plan
from autoshard.planning.pipeline_plan import STAGE_AXIS, TRANSFER, pipeline_mesh
from autoshard.planning.pipeline_stages import op_positions
from autoshard.planning.pipeline_work import seconds_per_run, work_kinds

CSV = Path(__file__).with_name("published_runs.csv")
COLUMNS = ("model", "layers", "hidden", "heads", "seq", "vocab", "gpus", "gpu", "tp", "pp", "dp", "interleave",
           "global_batch", "micro_batch", "recompute", "seq_parallel", "measured_s_per_step")
INTEGERS = ("layers", "hidden", "heads", "seq", "vocab", "gpus", "tp", "pp", "dp", "interleave", "global_batch",
            "micro_batch")
# the GPU a row names -> the topology profile pricing it
PROFILES = {"A100-80GB": "dgx-a100", "A100": "dgx-a100", "H100-80GB": "dgx-h100", "H100": "dgx-h100",
            "H200-141GB": "dgx-h200", "H200": "dgx-h200", "B200": "dgx-b200", "GB200": "gb200-nvl72"}
RECOMPUTE = {"full": "full", "selective": "selective", "none": "none", "no": "none"}
YES_NO = {"yes": True, "no": False, "true": True, "false": False}
SAMPLE_LAYERS = 3  # first, middle and last layer positions


@dataclass(frozen=True)
class Run:
    model: str
    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    gpus: int
    gpu: str
    tp: int
    pp: int
    dp: int
    interleave: int
    global_batch: int
    micro_batch: int
    recompute: str
    seq_parallel: bool
    measured_s_per_step: float | None

    @property
    def microbatches(self) -> int:
        return self.global_batch // (self.dp * self.micro_batch)


def read_runs(path: Path) -> list[Run]:
    """The CSV's rows, each checked: a problem names its line and column."""
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise InputError(f"missing columns {missing}; expected {list(COLUMNS)}", str(path))
        return [_run(row, f"{path}:{line}") for line, row in enumerate(reader, start=2)]


def _run(row: dict[str, str], where: str) -> Run:
    row = {column: (row.get(column) or "").strip() for column in COLUMNS}  # a short row leaves cells empty
    problems = []
    values: dict[str, Any] = {"model": row["model"]}
    for column in INTEGERS:
        try:
            values[column] = int(row[column], 10)
        except ValueError:
            values[column] = 0
        if values[column] < 1:
            problems.append(Problem(f"{where} {column}", f"must be a positive integer, got {row[column]!r}"))
    gpu = row["gpu"]
    if gpu not in PROFILES:
        problems.append(Problem(f"{where} gpu", f"unknown GPU {gpu!r}; known: {sorted(PROFILES)}"))
    recompute = RECOMPUTE.get(row["recompute"].lower())
    if recompute is None:
        problems.append(Problem(f"{where} recompute", f"must be one of {sorted(RECOMPUTE)}, got {row['recompute']!r}"))
    sequence = YES_NO.get(row["seq_parallel"].lower())
    if sequence is None:
        problems.append(Problem(f"{where} seq_parallel", f"must be yes or no, got {row['seq_parallel']!r}"))
    measured = row["measured_s_per_step"]
    try:
        measured_s = float(measured) if measured else None
    except ValueError:
        measured_s = -1.0
    if measured_s is not None and not (math.isfinite(measured_s) and measured_s > 0):
        problems.append(Problem(f"{where} measured_s_per_step", f"must be positive seconds or empty, got {measured!r}"))
    if problems:
        raise InputError(problems)
    run = Run(**values, gpu=gpu, recompute=recompute, seq_parallel=sequence, measured_s_per_step=measured_s)
    shape_problems = _shape_problems(run, where)
    if shape_problems:
        raise InputError(shape_problems)
    return run


def _shape_problems(run: Run, where: str) -> list[Problem]:
    problems = []
    if run.tp * run.pp * run.dp != run.gpus:
        problems.append(Problem(f"{where} gpus", f"must be tp x pp x dp = {run.tp * run.pp * run.dp}, got {run.gpus}"))
    if run.layers % (run.pp * run.interleave):
        problems.append(Problem(f"{where} layers", f"must split evenly into pp x interleave = "
                                                   f"{run.pp * run.interleave} chunks, got {run.layers}"))
    if run.global_batch % (run.dp * run.micro_batch):
        problems.append(Problem(f"{where} global_batch", f"must be a multiple of dp x micro_batch = "
                                                         f"{run.dp * run.micro_batch}, got {run.global_batch}"))
    if run.interleave > 1 and run.microbatches % run.pp:
        problems.append(Problem(f"{where} interleave", f"an interleaved schedule needs the microbatches "
                                                       f"({run.microbatches}) a multiple of pp ({run.pp})"))
    if run.hidden % run.heads or run.heads % run.tp:
        problems.append(Problem(f"{where} heads", f"must divide hidden and be a multiple of tp, got {run.heads}"))
    return problems


@dataclass(frozen=True)
class Prediction:
    step_s: float
    bubble_fraction: float
    memory_bytes_per_gpu: float  # the fullest stage's
    state_bytes_per_gpu: float
    activation_bytes_per_gpu: float
    solve: dict[str, Any]


def stage_mesh_of(run: Run) -> Mesh:
    """The mesh inside one pipeline stage."""
    return Mesh.of(dp=run.dp, tp=run.tp) if run.dp > 1 else Mesh.of(tp=run.tp)


def layer_step(run: Run, time_limit_s: float, deterministic: bool = True) -> tuple[PlanResult, Mesh]:
    """The plan of a three-layer sample of the run's model on the mesh inside a stage."""
    stage_mesh = stage_mesh_of(run)
    config = GPTConfig(layers=SAMPLE_LAYERS, hidden=run.hidden, heads=run.heads, seq=run.seq,
                       batch=run.micro_batch * run.dp, vocab=run.vocab, style="megatron")
    with training_precision("bf16-mixed"):
        document = gpt(config, training=True)
    document["constraints"] = megatron_constraints(document, run.seq_parallel, data_parallel=run.dp > 1)
    graph = with_recomputation(graph_from_json(document, stage_mesh), run.recompute, stage_mesh)
    hw = bind_hardware(PROFILES[run.gpu], pipeline_mesh(stage_mesh, run.pp))
    # memory is reported, not bound; a fixed amount of solver work, so every run prices alike
    settings = SolveSettings(time_limit_s=time_limit_s, workers=1, memory_budget_bytes=2.0**60, deterministic=deterministic,
                             gap_limit=1e-4 if deterministic else SEARCH_GAP_LIMIT)
    return make_plan(graph, stage_mesh, hw, settings), stage_mesh


@dataclass(frozen=True)
class LayerPrices:
    """What a three-layer sample prices for a stage's layout, whatever the pipeline around it:
    seconds per (position, kind), the bytes a stage sends the next, and the state and kept
    activation bytes per position."""

    seconds: dict[tuple[int, str], float]
    sent_bytes: float
    state_bytes: list[float]
    kept_bytes: float
    solve: dict[str, Any]


# The sample's prices depend on the stage's layout only (the stage axis is outermost, so a stage's
# dp and tp groups sit on the same links at any depth): pipelines of other depths reuse them.
LAYOUT_FIELDS = ("model", "layers", "hidden", "heads", "seq", "vocab", "gpu", "tp", "dp", "micro_batch",
                 "recompute", "seq_parallel")
_PRICES: dict[tuple, LayerPrices] = {}


def layer_prices(run: Run, time_limit_s: float, deterministic: bool = True) -> LayerPrices:
    key = tuple(getattr(run, f) for f in LAYOUT_FIELDS) + (time_limit_s, deterministic)
    if key not in _PRICES:
        result, stage_mesh = layer_step(run, time_limit_s, deterministic)
        plan, graph = result.plan, result.plan.graph
        positions = op_positions(graph)
        kinds = work_kinds(graph, positions)
        seconds = {(p, k): 0.0 for p in range(SAMPLE_LAYERS) for k in ("F", "B", "W", "tail")}
        for op, entry in seconds_per_run(result.report, graph).items():
            seconds[positions[op], kinds[op]] += entry["compute"] + entry["communication"]
        boundary = "layer1.mlp_residual"  # what one layer hands the next, as planned
        sent = tensor_bytes(graph.tensors[boundary].shape, graph.tensors[boundary].itemsize,
                            plan.produced(boundary), stage_mesh)
        _PRICES[key] = LayerPrices(seconds, sent, _state_bytes_per_layer(plan), kept_activation_bytes(plan, 1),
                                   {"status": result.solver["status"], "gap": result.solver.get("gap"),
                                    "solve_s": result.solver.get("solve_s")})
    return _PRICES[key]


def predict(run: Run, time_limit_s: float = 20.0, deterministic: bool = True) -> Prediction:
    """The row's step: deterministic solves by default (a fixed amount of work, so every run
    prices alike), or solves of `time_limit_s` seconds on the clock stopping at 1% of their bound
    (`--search`, which prices hundreds of layouts)."""
    prices = layer_prices(run, time_limit_s, deterministic)
    per = prices.seconds
    stages, chunks = run.pp, run.interleave
    per_chunk = run.layers // (stages * chunks)
    orders = stage_orders("interleaved" if chunks > 1 else "1f1b", stages, run.microbatches, chunks)
    last = orders.virtual_stages - 1

    def chunk_seconds(kind: str) -> list[list[float]]:
        table = []
        for stage in range(stages):
            row = []
            for chunk in range(chunks):
                virtual = orders.virtual_stage(stage, chunk)
                value = per_chunk * per[1, kind]
                value += (per[0, kind] - per[1, kind]) if virtual == 0 else 0.0
                value += (per[2, kind] - per[1, kind]) if virtual == last else 0.0
                row.append(value)
            table.append(row)
        return table

    last_stage = orders.placement(last)[0]

    def per_stage(table: dict[int, float]) -> list[float]:
        """A per-position quantity summed over each stage's layers, the embedding's and the
        head's extras with the stages holding them."""
        return [per_chunk * chunks * table[1] + (table[0] - table[1] if s == 0 else 0.0)
                + (table[2] - table[1] if s == last_stage else 0.0) for s in range(stages)]

    tail = per_stage({position: per[position, "tail"] for position in range(SAMPLE_LAYERS)})
    hw = bind_hardware(PROFILES[run.gpu], pipeline_mesh(stage_mesh_of(run), stages))
    transfer_s = hw.collective_seconds(TRANSFER, [STAGE_AXIS], prices.sent_bytes) if stages > 1 else None
    timeline = simulate_pipeline(orders, chunk_seconds("F"), chunk_seconds("B"), chunk_seconds("W"),
                                 transfer_s=transfer_s, tail_s=tail)
    held = activation_peaks(orders, [[per_chunk * prices.kept_bytes] * chunks for _ in range(stages)])
    state = per_stage(dict(enumerate(prices.state_bytes)))
    fullest = max(range(stages), key=lambda s: state[s] + held[s])
    return Prediction(timeline.step_s, timeline.bubble_fraction, state[fullest] + held[fullest], state[fullest],
                      held[fullest], prices.solve)


def _state_bytes_per_layer(plan: Any) -> list[float]:
    """Per sample layer position, the bytes per device of its parameters, master weights, Adam
    moments and main gradients, as planned (the embedding and head go with the first and last)."""
    graph = plan.graph
    positions = op_positions(graph)
    owner: dict[str, int] = {}
    for op in graph.ops:
        for t in op.inputs:
            if graph.tensors[t].role == "parameter":
                owner.setdefault(t, positions[op.name])
    grads = graph.gradients  # parameter -> its gradient value
    out = [0.0] * SAMPLE_LAYERS
    for name, position in owner.items():
        tensor = graph.tensors[name]
        out[position] += tensor_bytes(tensor.shape, tensor.itemsize, plan.produced(name), plan.mesh)
        if name in grads:
            grad = graph.tensors[grads[name]]
            out[position] += tensor_bytes(grad.shape, grad.itemsize, plan.produced(grads[name]), plan.mesh)
    return out


SEARCH_GAP_LIMIT = 0.01
MICRO_BATCHES = (1, 2, 4, 8)
INTERLEAVES = (1, 2, 3, 4)
STATE_BYTES_AT_LEAST = (2, 4 + 4 + 4 + 4)  # per parameter: bf16 weight (whole over dp); f32 grad, master, moments


def layouts(run: Run) -> list[Run]:
    """Every layout Megatron-LM could run the row's model in on its GPUs and global batch, that
    could hold its state: tp within a node dividing the heads, pp dividing the layers, V chunks
    of equal layers (V > 1 needs the microbatches a multiple of pp), micro batches dividing a
    replica's share, each recomputation, sequence parallelism wherever tp > 1. A layout whose
    least state (bf16 weights whole over dp, everything else sharded over it) exceeds the GPU's
    memory is left out unpriced."""
    profile = load_profile(PROFILES[run.gpu])
    node, hbm = profile.nvlink.domain_gpus, profile.hbm_bytes
    parameters = run.layers * 12 * run.hidden ** 2 + run.vocab * run.hidden
    found = []
    for tp in (t for t in range(1, node + 1) if run.gpus % t == 0 and run.heads % t == 0):
        for pp in (p for p in range(1, run.layers + 1) if run.layers % p == 0 and (run.gpus // tp) % p == 0):
            dp = run.gpus // (tp * pp)
            weights, rest = STATE_BYTES_AT_LEAST
            if parameters / (tp * pp) * (weights + rest / dp) > hbm:
                continue
            for micro, chunks, recompute in itertools.product(MICRO_BATCHES, INTERLEAVES, MODES):
                candidate = replace(run, tp=tp, pp=pp, dp=dp, interleave=chunks, micro_batch=micro, recompute=recompute,
                                    seq_parallel=tp > 1, measured_s_per_step=None)
                if chunks > 1 and pp == 1 or run.global_batch % (dp * micro):
                    continue
                if not _shape_problems(candidate, ""):
                    found.append(candidate)
    return found


def search(run: Run, time_limit_s: float) -> list[tuple[Run, Prediction]]:
    """The layouts of `layouts(run)` that fit the GPU's memory, fastest first."""
    hbm = load_profile(PROFILES[run.gpu]).hbm_bytes
    priced = []
    for candidate in layouts(run):
        try:
            prediction = predict(candidate, time_limit_s, deterministic=False)
        except AutoshardError:
            continue
        if prediction.memory_bytes_per_gpu <= hbm:
            priced.append((candidate, prediction))
    return sorted(priced, key=lambda pair: pair[1].step_s)


def layout_words(run: Run) -> str:
    return (f"{run.tp} x {run.pp} x {run.dp}, V {run.interleave}, micro {run.micro_batch}, {run.recompute}"
            f"{', SP' if run.seq_parallel else ''}")


def print_searches(runs: list[Run], time_limit_s: float) -> None:
    """Per model and cluster: the fastest fitting layout beside each published one, their
    predicted seconds, and the published layout's rank among the fitting ones."""
    print("| model | GPUs | layouts priced (fitting) | fastest found | predicted s | memory (GiB) | published layout | "
          "its predicted s | its rank |\n| --- | ---: | ---: | --- | ---: | ---: | --- | ---: | ---: |")
    for key, group in itertools.groupby(runs, key=lambda r: (r.model, r.gpus, r.global_batch)):
        group = list(group)
        ranked = search(group[0], time_limit_s)
        if not ranked:
            print(f"| {key[0]} | {key[1]} | 0 | - | - | - | - | - | - |")
            continue
        best, best_p = ranked[0]
        for published in group:
            mine = predict(published, time_limit_s, deterministic=False)
            rank = 1 + sum(1 for _, p in ranked if p.step_s < mine.step_s)
            print(f"| {key[0]} | {key[1]} | {len(layouts(group[0]))} ({len(ranked)}) | {layout_words(best)} | "
                  f"{best_p.step_s:.4g} | {best_p.memory_bytes_per_gpu / 2**30:.1f} | {layout_words(published)} | "
                  f"{mine.step_s:.4g} | {rank} |", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--csv", type=Path, default=CSV, help=f"rows to price (columns: {', '.join(COLUMNS)})")
    parser.add_argument("--json", action="store_true", help="one JSON object per row instead of the table")
    parser.add_argument("--only", action="append", default=[], help="price only rows of this model (repeatable)")
    parser.add_argument("--time-limit", type=float, default=20.0, help="solver seconds per row (default 20)")
    parser.add_argument("--search", action="store_true",
                        help="per model and cluster, the fastest layout that fits beside the published ones "
                             "(--time-limit then bounds each solve on the clock; 3 is plenty)")
    args = parser.parse_args(argv)
    try:
        runs = [r for r in read_runs(args.csv) if not args.only or r.model in args.only]
    except InputError as error:
        for problem in error.problems:
            print(f"published_runs: {problem}", file=sys.stderr)
        return 2
    if args.search:
        print_searches(runs, args.time_limit)
        return 0
    errors, failed = [], 0
    if not args.json:
        print("| model | GPUs | tp x pp x dp, V | recompute, SP | predicted s | measured s | error | bubble | "
              "memory per GPU (GiB) |\n| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for run in runs:
        try:
            p = predict(run, args.time_limit)
        except AutoshardError as error:  # a shape the planner refuses: said, and the other rows priced
            print(f"published_runs: {run.model} ({run.tp} x {run.pp} x {run.dp}): {error}", file=sys.stderr)
            failed += 1
            continue
        error = (p.step_s / run.measured_s_per_step - 1) if run.measured_s_per_step else None
        if error is not None:
            errors.append(error)
        if args.json:
            print(json.dumps({**{c: getattr(run, c) for c in COLUMNS}, "predicted_s_per_step": p.step_s,
                              "predicted_memory_bytes_per_gpu": p.memory_bytes_per_gpu,
                              "predicted_state_bytes_per_gpu": p.state_bytes_per_gpu,
                              "predicted_activation_bytes_per_gpu": p.activation_bytes_per_gpu,
                              "bubble_fraction": p.bubble_fraction, "solve": p.solve}), flush=True)
        else:
            print(f"| {run.model} | {run.gpus} | {run.tp} x {run.pp} x {run.dp}, {run.interleave} | {run.recompute}, "
                  f"{'yes' if run.seq_parallel else 'no'} | {p.step_s:.4g} | {run.measured_s_per_step or '-'} | "
                  f"{'-' if error is None else f'{100 * error:+.1f}%'} | {100 * p.bubble_fraction:.1f}% | "
                  f"{p.memory_bytes_per_gpu / 2**30:.1f} |", flush=True)
    if errors and not args.json:
        print(f"\nmean |error| {100 * sum(map(abs, errors)) / len(errors):.2f}%, "
              f"worst {100 * max(map(abs, errors)):.2f}% over {len(errors)} rows")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
