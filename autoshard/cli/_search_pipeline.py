"""`search`'s `--pipeline auto`: the pipelined configurations priced beside the plain search, their
table and ranking.json section, and the winner delivered as `plan --pipeline S` delivers it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from autoshard.cli.plan import print_summary, write_deliverables
from autoshard.delivery.deliver import deliver
from autoshard.errors import InputError, Problem
from autoshard.graph.recompute import record_recompute
from autoshard.graph.schema import load_graph
from autoshard.planning.pipeline_stages import layer_order
from autoshard.search.pipeline_ranking import pipeline_section, pipeline_table
from autoshard.search.pipelined import PipelineSearch, check_stage_count, search_pipelines
from autoshard.search.stage_tasks import StageTask
from autoshard.search.throughput import Throughput
from autoshard.search.run import SearchOptions, SearchResult


def add_pipeline_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pipeline", metavar="auto|S",
                        help="also pipeline: 'auto' chooses the stages, microbatches, schedule and each stage's mesh "
                             "(S = 1 is the plain search); a number S searches S stages only; needs ops with a "
                             "`layer`")


def pipeline_problems(args: argparse.Namespace) -> list[Problem]:
    text = (args.pipeline or "").strip().lower()
    if args.pipeline is not None and text != "auto" and not (text.isascii() and text.isdigit() and int(text) >= 2):
        return [Problem("--pipeline", f"expected auto (the search chooses S) or a number of stages of at least 2, "
                                      f"got {args.pipeline!r}")]
    return []


def searched_stages(args: argparse.Namespace) -> int | None:
    """The stage count `--pipeline S` fixes; None for `auto`."""
    text = args.pipeline.strip().lower()
    return None if text == "auto" else int(text)


def check_pipelinable(document: dict[str, Any], stages: int | None, devices: int) -> None:
    """A graph without layers, or a stage count that does not fit it and the devices, refused
    before the plain search runs, naming --pipeline."""
    try:
        layers = len(layer_order(load_graph(document)))
        if stages is not None:
            check_stage_count(stages, devices, layers)
    except InputError as error:
        raise InputError(error.problems[0].message, "--pipeline") from None


def search_pipelined(document: dict[str, Any], options: SearchOptions, plain: SearchResult,
                     ranking: dict[str, Any], rates: Throughput, stages: int | None = None) -> PipelineSearch:
    """The pipelined configurations priced; their section in `ranking` and their table printed."""
    try:
        found = search_pipelines(document, options, plain, progress=_progress, stages=stages)
    except InputError as error:
        raise InputError([Problem("--pipeline" if p.where == "pipeline" else p.where, p.message)
                          for p in error.problems]) from None
    ranking["pipeline"] = pipeline_section(found, rates)
    print("\n".join(pipeline_table(ranking["pipeline"])))
    chosen = ranking["pipeline"]["chosen"]
    print(f"chosen: {chosen['stages']} stage(s), step {chosen['step_s'] * 1e3:.4g} ms; no configuration's plan has a "
          f"step under {found.certified_bound_s * 1e3:.4g} ms" if chosen["step_s"] is not None else
          "no configuration has a plan")
    return found


def _progress(done: int, total: int, task: StageTask, outcome: str) -> None:
    mesh = task.candidate.mesh_text
    print(f"  intra-stage plan {done}/{total}: {task.stages} stages of {mesh}, {task.microbatches} microbatch(es): "
          f"{'solved' if outcome == 'result' else outcome}", file=sys.stderr, flush=True)


def deliver_pipelined(args: argparse.Namespace, found: PipelineSearch, stages: tuple[str, ...], recompute: str) -> int:
    """The winning pipelined plan written as `plan --pipeline S` writes it."""
    best = found.best
    assert best is not None and best.pipelined is not None and best.placement is not None
    pipelined, placement = best.pipelined, best.placement
    delivered = deliver(pipelined.result, placement.hardware, args.topology, emit=stages, dialect=args.dialect,
                        arguments=args.arguments, verify=args.verify, optimize_collectives=not args.no_collective_opt,
                        nodes=placement.nodes, slice_shape=placement.slice_shape, mapping=placement.mapping,
                        pipeline=pipelined.cut)
    delivered.document["pipeline"] = pipelined.to_json()
    delivered.document["search"] = {"ranking": "ranking.json", "configurations": len(found.priced),
                                    "certified_lower_bound_step_s": found.certified_bound_s}
    record_recompute(delivered.document, recompute)
    written = write_deliverables(delivered, args.output, pipelined.result.phases)
    print_summary(delivered.document, ([Path(args.output) / "ranking.json"] if args.output else []) + written)
    return 1 if delivered.document["verification"]["status"] == "failed" else 0
