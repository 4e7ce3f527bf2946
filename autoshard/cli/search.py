"""`autoshard search GRAPH.json --devices 64 --topology dgx-h100 -o DIR`: which mesh, laid out how,
for this model on these devices; ranked, the winner written as `autoshard plan` writes a plan."""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoshard.cli._search_layered import add_layered_args, layered_problems, run_layered
from autoshard.cli._search_pipeline import (add_pipeline_arg, check_pipelinable, deliver_pipelined, pipeline_problems,
                                            search_pipelined, searched_stages)
from autoshard.cli.args import integer_flag, number_flag
from autoshard.cli.plan import (add_recompute_arg, add_solve_args, checked_settings, print_summary,
                                recomputations, write_deliverables)
from autoshard.delivery.deliver import deliver
from autoshard.errors import InputError, Interrupted, Problem
from autoshard.graph.builder import document_text
from autoshard.graph.recompute import record_recompute
from autoshard.graph.schema import graph_from_json, graph_to_json, load_graph, read_json
from autoshard.search.candidates import MAX_AXES, parse_fixed
from autoshard.search.ranking import best_plan, ranking_document, ranking_table
from autoshard.search.pipelined import PipelineSearch, plain_step_bound_s, winner_step_s
from autoshard.search.run import Entry, SearchOptions, SearchResult, search
from autoshard.search.tasks import SearchInputs
from autoshard.search.throughput import throughput


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("search", help="find the best mesh and placement for a graph on a number of devices")
    parser.add_argument("graph", help="graph JSON (format autoshard.graph/v1)")
    parser.add_argument("--devices", type=integer_flag, required=True, help="number of devices (GPUs or TPU chips)")
    parser.add_argument("--topology", default="dgx-h100", help="profile name (see `autoshard topologies`) or a profile "
                                                               "JSON file; GPU nodes are devices / GPUs per node, TPU "
                                                               "candidates include every slice shape of the devices")
    parser.add_argument("--max-axes", type=integer_flag, default=MAX_AXES,
                        help="most mesh axes a candidate has (1-4, default 4)")
    parser.add_argument("--fix", default="", help="axes every candidate has, by name and size, e.g. tp=8 (the other "
                                                  "axes are named a0, a1, ... by mesh position)")
    parser.add_argument("--jobs", type=integer_flag, default=min(os.cpu_count() or 1, 4),
                        help="solves at a time, on local processes or Ray (default: CPUs, at most 4)")
    parser.add_argument("--ray", help="run the solves on Ray: 'auto' (a running local instance, else one started "
                                      "for the search) or a cluster address like ray://host:10001")
    parser.add_argument("--time-budget", type=number_flag, help="seconds the whole search may take (default: no limit); "
                                                          "each solve's time limit is cut to what is left")
    add_pipeline_arg(parser)
    add_layered_args(parser)
    add_recompute_arg(parser, auto="every candidate searched with each mode, the fastest plan kept")
    add_solve_args(parser, workers=1)
    parser.set_defaults(run=run)


def checked_options(args: argparse.Namespace) -> SearchOptions:
    settings, _ = checked_settings(args)
    problems: list[Problem] = pipeline_problems(args) + layered_problems(args)
    if not 2 <= args.devices <= 2 ** 20:
        problems.append(Problem("--devices", f"must be an integer in [2, 2**20], got {args.devices}"))
    if not 1 <= args.max_axes <= MAX_AXES:
        problems.append(Problem("--max-axes", f"must be in [1, {MAX_AXES}], got {args.max_axes}"))
    if args.jobs < 1:
        problems.append(Problem("--jobs", f"must be at least 1, got {args.jobs}"))
    if args.time_budget is not None and not (math.isfinite(args.time_budget) and args.time_budget > 0):
        problems.append(Problem("--time-budget", f"must be a positive number of seconds, got {args.time_budget:g}"))
    try:
        fixed = parse_fixed(args.fix)
    except InputError as error:
        problems += error.problems
        fixed = {}
    if problems:
        raise InputError(problems)
    return SearchOptions(devices=args.devices, topology=args.topology, settings=settings, max_axes=args.max_axes,
                         fixed=fixed, jobs=args.jobs, ray=args.ray, time_budget_s=args.time_budget)


def recomputed_documents(document: Any, recompute: str) -> dict[str, Any]:
    """Mode -> the graph document rewritten so (`plan --recompute`), for every candidate: the
    mode asked for, or with `auto` each mode that changes the graph (`plan`'s `recomputations`)."""
    try:
        graph = graph_from_json(document)
        rewritten = recomputations(graph, recompute, None)
    except InputError as error:
        raise InputError([Problem("--recompute" if p.where == "recompute" else p.where, p.message)
                          for p in error.problems]) from None
    return {mode: document if step is graph else graph_to_json(step) for mode, step in rewritten.items()}


@dataclass
class Searched:
    """One recomputation's search: its candidates ranked, and its pipelined configurations."""

    mode: str
    document: Any
    result: SearchResult
    ranking: dict[str, Any]
    pipelined: PipelineSearch | None

    @property
    def step_s(self) -> float:
        """The winner's step (pipelined or not); inf without a plan."""
        if self.pipelined is not None and self.pipelined.best is not None:
            return self.pipelined.best.step_s
        return winner_step_s(self.result) if self.result.best is not None else math.inf

    def bound_s(self, weights: Any) -> float:
        """No plan of this mode's candidates (and configurations) has a shorter step."""
        if self.pipelined is not None:
            return self.pipelined.certified_bound_s
        return plain_step_bound_s(self.result, load_graph(self.document), weights)


class SearchProgress:
    """One line per finished candidate; on a terminal, a line rewritten in place instead."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.live = sys.stderr.isatty()

    def __call__(self, phase: str, done: int, total: int, entry: Entry) -> None:
        now = time.perf_counter() - self.started
        what = entry.outcome if phase == "solve" else "bounded"
        if entry.solved:
            what += f", step {entry.solved['step_s'] * 1e3:.4g} ms"
        doing = "bounding" if phase == "bound" else "solving"
        text = f"  {now:6.1f}s {doing} {done}/{total}: {entry.candidate.label} {what}"
        if self.live:
            print("\r\033[K" + text[:160], end="", file=sys.stderr, flush=True)
        else:
            print(text, file=sys.stderr, flush=True)

    def finish(self) -> None:
        if self.live:
            print(file=sys.stderr, flush=True)


def _field(where: str) -> str:
    """A search option's name as the flag a user set."""
    return {"devices": "--devices", "max_axes": "--max-axes", "fix": "--fix", "jobs": "--jobs", "ray": "--ray",
            "time_budget_s": "--time-budget"}.get(where, "--topology" if where.startswith("topology") else where)


SPENT_S = 1e-3  # the budget a mode gets once --time-budget is spent: it stops at its first check


def run(args: argparse.Namespace) -> int:
    started = getattr(args, "command_started", time.perf_counter())  # set by `main`
    options = checked_options(args)
    if args.by_layer:
        try:
            return run_layered(args, read_json(args.graph), options, searched_stages(args) if args.pipeline else 1,
                               started)
        except InputError as error:
            raise InputError([Problem(_field(p.where), p.message) for p in error.problems]) from None
    documents = recomputed_documents(read_json(args.graph), args.recompute)
    stages = tuple(dict.fromkeys(part.strip() for part in args.emit.split(",") if part.strip()))
    if args.pipeline:
        check_pipelinable(next(iter(documents.values())), searched_stages(args), options.devices)
    searched = []
    for index, (mode, document) in enumerate(documents.items()):
        if len(documents) > 1:
            print(f"recompute {mode}: searching", file=sys.stderr, flush=True)
        share = options
        if options.time_budget_s is not None:  # the modes share --time-budget: each its part of what is left
            left_s = options.time_budget_s - (time.perf_counter() - started)
            if left_s <= 0 and searched:  # the first mode is searched, if only to say the budget ran out
                print(f"recompute {mode}: not searched, --time-budget spent", file=sys.stderr, flush=True)
                continue
            share = dataclasses.replace(options, time_budget_s=max(left_s, SPENT_S) / (len(documents) - index))
        searched.append(_search_one(mode, document, share, args))
    chosen = min(searched, key=lambda one: one.step_s)
    ranking = chosen.ranking
    if len(searched) > 1:
        ranking["recompute_searched"] = _modes_json(searched, chosen, options)
        print("\n".join(_modes_table(ranking["recompute_searched"])))
    if args.output:
        (Path(args.output) / "ranking.json").write_text(document_text(ranking))
    if chosen.pipelined is not None and chosen.pipelined.best is not None:
        return deliver_pipelined(args, chosen.pipelined, stages, chosen.mode)
    result, document = chosen.result, chosen.document
    if result.best is None:
        raise result.no_plan_error()
    gap = "unknown" if result.gap is None else f"{100 * result.gap:.2f}%"
    print(f"best: {result.best.candidate.label}, certified within {gap} of every candidate's best plan"
          + (f" with recompute {chosen.mode}" if len(searched) > 1 else ""))
    plan_result, hardware = best_plan(result, SearchInputs(document, options.topology, options.settings))
    candidate = result.best.candidate
    delivered = deliver(plan_result, hardware, args.topology, emit=stages, dialect=args.dialect,
                        arguments=args.arguments, verify=args.verify, optimize_collectives=not args.no_collective_opt,
                        nodes=candidate.nodes, slice_shape=candidate.slice_shape, mapping=candidate.mapping_json)
    delivered.document["search"] = {"ranking": "ranking.json", "candidates": result.counts["candidates"],
                                    "gap": result.gap}
    record_recompute(delivered.document, chosen.mode)
    written = write_deliverables(delivered, args.output, plan_result.phases)
    print_summary(delivered.document, ([Path(args.output) / "ranking.json"] if args.output else []) + written)
    return 1 if delivered.document["verification"]["status"] == "failed" else 0


def _search_one(mode: str, document: Any, options: SearchOptions, args: argparse.Namespace) -> Searched:
    """Every candidate (and with --pipeline every configuration) on the step rewritten as `mode` says."""
    progress = SearchProgress()
    try:
        result = search(document, options, progress=progress)
    except InputError as error:
        raise InputError([Problem(_field(p.where), p.message) for p in error.problems]) from None
    except KeyboardInterrupt:
        raise Interrupted("interrupted; the workers were stopped") from None
    finally:
        progress.finish()
    rates = throughput(load_graph(document), options.topology)
    ranking = ranking_document(result, options, str(document.get("name", Path(args.graph).stem)), rates)
    record_recompute(ranking, mode)
    print("\n".join(ranking_table(ranking)))
    counts = result.counts
    print(f"{counts['placements']} placements in {counts['candidates']} candidates: {counts['pruned']} pruned, "
          f"{counts['solved']} solved, {counts['infeasible']} infeasible, {counts['unsolved']} unsolved; "
          f"{result.wall_s:.1f} s on {result.where}")
    pipelined = (search_pipelined(document, options, result, ranking, rates, searched_stages(args))
                 if args.pipeline else None)
    return Searched(mode, document, result, ranking, pipelined)


def _modes_json(searched: list[Searched], chosen: Searched, options: SearchOptions) -> dict[str, Any]:
    """`--recompute auto`: each mode's winning step and certified bound, the mode kept, and the
    bound over every mode (no plan of any candidate with any recomputation has a shorter step)."""
    weights = options.settings.weights
    bounds = {one.mode: one.bound_s(weights) for one in searched}
    return {"chosen": chosen.mode,
            "certified_lower_bound_step_s": min(bounds.values()),
            "modes": [{"recompute": one.mode, "step_s": one.step_s if math.isfinite(one.step_s) else None,
                       "certified_lower_bound_step_s": bounds[one.mode]} for one in searched]}


def _modes_table(section: dict[str, Any]) -> list[str]:
    lines = [f"{'recompute':<10} {'best step ms':>12} {'bound ms':>10}"]
    for row in section["modes"]:
        step = f"{row['step_s'] * 1e3:.4g}" if row["step_s"] is not None else "no plan"
        lines.append(f"{row['recompute']:<10} {step:>12} {row['certified_lower_bound_step_s'] * 1e3:>10.4g}"
                     + ("  chosen" if row["recompute"] == section["chosen"] else ""))
    lines.append(f"no plan with any recomputation has a step under "
                 f"{section['certified_lower_bound_step_s'] * 1e3:.4g} ms")
    return lines
