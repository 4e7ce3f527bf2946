"""Generate the solver's test bed: IOPDDL-format instances beyond the contest's nine.

Two families, each instance described in `corpus_manifest.json` (parameters, seed, time limit):
- `formulation`: autoshard's own problems, a GPT, LLaMA or MoE training step formulated on a
  2-D or 3-D mesh, with the memory limit set to `budget_factor` times the peak of the
  smallest-usage plan (each node at its least-usage strategy);
- `contest`: a contest instance made harder: its memory limit moved to
  `smallest peak + memory_fraction * (limit - smallest peak)`, or to `peak_factor` times the
  peak of the best plan known at the contest's limit (its witness: the limit sits within 0.1-1 %
  of what the best plan needs, issue 37), and/or "crosscut" edges added:
  `hubs` random nodes, each tied to `per_hub` random others by a matrix that allows one column
  per row (all other entries FORBIDDEN_COST, the allowed ones cost 0, as the contest's crosscut
  edges do). The allowed entries always include the pair a witness solution uses, so the
  instance stays feasible; the witnesses (short solves of the tightened instance) are kept in
  `corpus_witnesses.json.gz`, which makes the instances independent of later solver changes.

Files are written as gzipped JSON with `write_iopddl` (no time stamp: the same problem gives the
same bytes) into `benchmarks/corpus/` (git-ignored), and each file's SHA-256 is checked against
the manifest; `--record` writes the hashes and sizes into the manifest instead (after a change
of the generator or of the formulation, which then changes the corpus on purpose).

    python benchmarks/iopddl_corpus.py [--only NAME,...] [--out DIR] [--record]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gzip
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.models import GPTConfig, MoEConfig, gpt, moe
from autoshard.planning.formulation import formulate
from autoshard.planning.hardware import bind_hardware
from autoshard.solver import FORBIDDEN_COST, Problem, read_iopddl, score, solve, write_iopddl
from iopddl_bench import DEFAULT_DIR as CONTEST_DIR

HERE = Path(__file__).resolve().parent
MANIFEST = HERE / "corpus_manifest.json"
WITNESSES = HERE / "corpus_witnesses.json.gz"
DEFAULT_OUT = HERE / "corpus"
# A short solve of the tightened instance: any plan that fits will do, a good one is not needed.
WITNESS_SOLVE_S = 30.0
WITNESS_GAP = 0.05
MODELS = {"gpt": (GPTConfig, gpt), "moe": (MoEConfig, moe)}


def smallest_peak(problem: Problem) -> int:
    """Peak memory of the smallest-usage plan (each node at its least-usage strategy): no plan
    peaks lower, and this one fits any limit at or above it."""
    return score(problem, [int(np.argmin(u)) for u in problem.node_usages]).peak_usage


@functools.lru_cache(maxsize=1)
def formulated(model: str, config_json: str, mesh_text: str, topology: str) -> Problem:
    """A model's training step formulated on a mesh, at the chip's memory (several instances
    share one formulation and differ in the limit only)."""
    config_type, generate = MODELS[model]
    graph = graph_from_json(generate(config_type(**json.loads(config_json)), training=True))
    mesh = Mesh.parse(mesh_text)
    devices = mesh.group_size(mesh.axis_names)
    hw = bind_hardware(topology, mesh, nodes=max(1, devices // 8) if devices > 8 else None)
    return formulate(graph, mesh, hw, memory_budget_bytes=hw.hbm_bytes).problem


def formulation_problem(spec: dict) -> Problem:
    """A formulated training step with its memory limit at `budget_factor` times the
    smallest-usage peak (the formulation's limit is its memory budget in bytes)."""
    problem = formulated(spec["model"], json.dumps(spec["config"], sort_keys=True), spec["mesh"], spec["topology"])
    limit = int(np.ceil(spec["budget_factor"] * smallest_peak(problem)))
    return dataclasses.replace(problem, usage_limit=limit, name=spec["name"])


def contest_problem(spec: dict, contest_dir: Path, witnesses: dict[str, list[int]]) -> Problem:
    """A contest instance with a tighter limit and/or crosscut edges; adds a witness to
    `witnesses` when it has none yet."""
    source = contest_dir / f"asplos-2025-iopddl-{spec['contest']}.json.gz"
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    if digest != spec["source_sha256"]:
        raise SystemExit(f"{source}: SHA-256 {digest}, the manifest expects {spec['source_sha256']}")
    problem = read_iopddl(source)
    if "peak_factor" in spec:
        return at_best_peak(problem, spec, witnesses)
    fraction = spec.get("memory_fraction", 1.0)
    least = smallest_peak(problem)
    limit = least + int(fraction * (problem.usage_limit - least))
    problem = dataclasses.replace(problem, usage_limit=limit, name=spec["name"])
    if "crosscut" not in spec:
        return problem
    if spec["name"] not in witnesses:
        found = solve(problem, time_limit_s=WITNESS_SOLVE_S, workers=2, seed=spec["seed"], gap_limit=WITNESS_GAP)
        if not found.feasible or score(problem, list(found.solution)).forbidden:
            raise SystemExit(f"{spec['name']}: no plan fits the tightened limit in {WITNESS_SOLVE_S:g} s; "
                             "raise memory_fraction")
        witnesses[spec["name"]] = list(found.solution)
        save_witnesses(witnesses)  # at once: the instances made so far depend on it
    witness = np.asarray(witnesses[spec["name"]], dtype=np.int64)
    return with_crosscut(problem, witness, np.random.default_rng(spec["seed"]), **spec["crosscut"])


def at_best_peak(problem: Problem, spec: dict, witnesses: dict[str, list[int]]) -> Problem:
    """The contest instance with its limit at `peak_factor` times the peak of its best known plan
    (the witness, from a solve of `witness_solve_s` at the contest's limit when there is none
    yet): memory-tight, and that plan still fits."""
    if spec["name"] not in witnesses:
        found = solve(problem, time_limit_s=spec["witness_solve_s"], workers=1, seed=spec["seed"])
        if not found.feasible:
            raise SystemExit(f"{spec['name']}: no plan in {spec['witness_solve_s']:g} s")
        witnesses[spec["name"]] = list(found.solution)
        save_witnesses(witnesses)
    peak = score(problem, witnesses[spec["name"]]).peak_usage
    return dataclasses.replace(problem, usage_limit=int(peak * spec["peak_factor"]), name=spec["name"])


def with_crosscut(problem: Problem, witness: np.ndarray, rng: np.random.Generator, *, hubs: int,
                  per_hub: int) -> Problem:
    """`problem` plus `hubs * per_hub` crosscut edges between nodes with a choice, none doubling
    an existing pair. Each matrix allows one random column per row (the witness's pair among
    them) and forbids the rest: at most half its entries allowed."""
    sizes = problem.num_strategies()
    choosable = np.flatnonzero(sizes > 1)
    taken = {tuple(sorted(pair)) for pair in problem.edges.tolist()}
    edges, matrices = [], []
    for hub in rng.choice(choosable, size=hubs, replace=False).tolist():
        added = 0
        while added < per_hub:
            other = int(rng.choice(choosable))
            if other == hub or tuple(sorted((hub, other))) in taken:
                continue
            taken.add(tuple(sorted((hub, other))))
            matrix = np.full((sizes[hub], sizes[other]), FORBIDDEN_COST, dtype=np.int64)
            columns = rng.integers(0, sizes[other], size=sizes[hub])
            columns[witness[hub]] = witness[other]
            matrix[np.arange(sizes[hub]), columns] = 0
            edges.append([hub, other])
            matrices.append(matrix)
            added += 1
    return dataclasses.replace(problem, edges=np.concatenate([problem.edges, np.array(edges, dtype=np.int64)]),
                               edge_costs=problem.edge_costs + tuple(matrices))


def json_sha256(path: Path) -> str:
    """SHA-256 of the instance's JSON text (not of the gzip stream, which a zlib version may change)."""
    with gzip.open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def load_witnesses() -> dict[str, list[int]]:
    if not WITNESSES.exists():
        return {}
    with gzip.open(WITNESSES, "rt", encoding="utf-8") as handle:
        return json.load(handle)


def save_witnesses(witnesses: dict[str, list[int]]) -> None:
    text = json.dumps(dict(sorted(witnesses.items())), separators=(",", ":"))
    with WITNESSES.open("wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as handle:
        handle.write(text.encode("utf-8"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="directory for the instances")
    parser.add_argument("--contest-dir", type=Path, default=CONTEST_DIR)
    parser.add_argument("--only", default="", help="comma-separated instance names")
    parser.add_argument("--record", action="store_true",
                        help="write the files' hashes and sizes into the manifest instead of checking them")
    args = parser.parse_args(argv)
    manifest = json.loads(MANIFEST.read_text())
    wanted = {s.strip() for s in args.only.split(",") if s.strip()}
    unknown = wanted - {spec["name"] for spec in manifest["instances"]}
    if unknown:
        print(f"--only: no such instance {sorted(unknown)} in {MANIFEST.name}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    witnesses = load_witnesses()
    mismatched = []
    for spec in manifest["instances"]:
        if wanted and spec["name"] not in wanted:
            continue
        started = time.monotonic()
        if spec["family"] == "formulation":
            problem = formulation_problem(spec)
        else:
            problem = contest_problem(spec, args.contest_dir, witnesses)
        path = args.out / f"{spec['name']}.json.gz"
        write_iopddl(problem, path)
        digest = json_sha256(path)
        made = {"nodes": problem.num_nodes, "edges": problem.num_edges, "usage_limit": problem.usage_limit,
                "json_sha256": digest}
        if args.record:
            spec.update(made)
        elif spec.get("json_sha256") != digest:
            mismatched.append(spec["name"])
        print(f"{spec['name']}: {problem.num_nodes} nodes, {problem.num_edges} edges, limit {problem.usage_limit}, "
              f"{time.monotonic() - started:.1f} s{'' if spec.get('json_sha256') == digest else ' (new hash)'}",
              flush=True)
    save_witnesses(witnesses)
    if args.record:
        manifest["generated_at_commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE,
                                                         capture_output=True, text=True).stdout.strip()
        MANIFEST.write_text(json.dumps(manifest, indent=1) + "\n")
    if mismatched:
        print(f"differ from the manifest's hashes: {', '.join(mismatched)} (a changed generator or formulation; "
              "--record to accept)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
