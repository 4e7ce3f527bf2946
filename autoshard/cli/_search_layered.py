"""`search --by-layer`: the configuration space of a stack of layers searched from a three-layer
sample (`search/layered.py`), ranked in ranking.json's `by_layer` section, and the winner planned
whole and written as `plan` writes a plan (unless `--rank-only`)."""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from pathlib import Path
from typing import Any

from autoshard.cli.args import number_flag
from autoshard.cli.plan import print_summary, recomputations, write_deliverables
from autoshard.delivery.deliver import deliver
from autoshard.errors import InfeasibleError, InputError, Interrupted, Problem
from autoshard.graph.builder import document_text
from autoshard.graph.recompute import record_recompute, with_recomputation
from autoshard.graph.schema import graph_from_json, load_graph
from autoshard.planning.layer_sample import layer_sample
from autoshard.planning.make_plan import make_plan
from autoshard.planning.pipeline_plan import PipelineSettings, plan_pipeline
from autoshard.planning.pipeline_stages import op_positions
from autoshard.graph.model import Graph
from autoshard.planning.layer_sample import LayerSample
from autoshard.search.compare import Layout, compared_key, parse_layout
from autoshard.search.layered import KeyOutcome, LayeredSearch, PricedLayered, price_key, search_layered
from autoshard.search.layered_ranking import behind, configuration_json, layered_section, layered_table
from autoshard.search.pipelined import batch_sizes, check_stage_count
from autoshard.search.sample_tasks import SampleTask
from autoshard.search.ranking import FORMAT
from autoshard.search.run import POLL_S, SearchOptions
from autoshard.search.stage_tasks import bind_stages
from autoshard.search.tasks import SearchInputs, bind_candidate
from autoshard.search.throughput import Throughput, throughput


def add_layered_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--by-layer", action="store_true",
                        help="search from a sample of the stack (its first, one middle and its last layer), solved "
                             "once per stage count, sub-mesh, microbatch count and recomputation and priced for "
                             "every schedule: for models of tens of layers on hundreds of devices; with --pipeline "
                             "auto every stage count, with --pipeline S that one, else S = 1")
    parser.add_argument("--sample-time-limit", type=number_flag, default=3.0,
                        help="with --by-layer: each sample solve's time limit in seconds (default 3; --time-limit "
                             "is the winner's whole plan's)")
    parser.add_argument("--rank-only", action="store_true",
                        help="with --by-layer: write ranking.json and stop, without planning the winner whole")
    parser.add_argument("--compare", metavar="LAYOUT",
                        help="with --by-layer: also price this layout in Megatron-LM's words, its shardings pinned, "
                             "and rank it, e.g. 'tp=8,pp=16,dp=8,interleave=1,micro=1,recompute=full' (sp=0 turns "
                             "sequence parallelism off; a Megatron-style graph)")


def layered_problems(args: argparse.Namespace) -> list[Problem]:
    problems = []
    if args.rank_only and not args.by_layer:
        problems.append(Problem("--rank-only", "ranks without planning the winner only with --by-layer"))
    if not (math.isfinite(args.sample_time_limit) and args.sample_time_limit > 0):
        problems.append(Problem("--sample-time-limit", f"must be a positive number of seconds, got "
                                                        f"{args.sample_time_limit:g}"))
    if args.compare is not None and not args.by_layer:
        problems.append(Problem("--compare", "a layout is compared with the configurations of --by-layer only"))
    elif args.compare is not None:
        try:
            parse_layout(args.compare)
        except InputError as error:
            problems += error.problems
    return problems


RANKING_S = 1.0  # what pricing the compared layout, the table and ranking.json take after the search (at most)


def run_layered(args: argparse.Namespace, document: dict[str, Any], options: SearchOptions,
                stages: int | None, started: float) -> int:
    """The search (of stage count `stages` only, or every one for None), its table and
    ranking.json; then the winner planned whole and delivered. `--time-budget` counts from
    `started` (`time.perf_counter()` when the command began)."""
    try:
        sample = layer_sample(document)
        sample_graph = graph_from_json(sample.document)
        modes = tuple(recomputations(sample_graph, args.recompute, None))
    except InputError as error:
        flags = {"layers": "--by-layer", "pipeline": "--by-layer", "recompute": "--recompute"}
        raise InputError([Problem(flags.get(p.where, p.where), p.message) for p in error.problems]) from None
    print(f"layer sample: layers {sample.layers[0]}, {sample.layers[1] if len(sample.layers) > 1 else '-'} and "
          f"{sample.layers[-1]} stand for all {len(sample.layers)} ({time.perf_counter() - started:.1f} s)",
          file=sys.stderr, flush=True)
    if stages is not None and stages > 1:
        try:
            check_stage_count(stages, options.devices, len(sample.layers))
        except InputError as error:
            raise InputError(error.problems[0].message, "--pipeline") from None
    sampled = dataclasses.replace(options, settings=dataclasses.replace(options.settings,
                                                                         time_limit_s=args.sample_time_limit))
    positions = op_positions(sample_graph)
    repeats = {op.name: sample.counts[positions[op.name]] for op in sample_graph.ops}
    rates = throughput(sample_graph, options.topology, repeats)
    compared = None if args.compare is None else _compared_task(args.compare, sample, sample_graph, sampled)
    if options.time_budget_s is not None:  # the budget is the whole command's: the sample took its part, and
        left_s = options.time_budget_s - (time.perf_counter() - started) - RANKING_S  # the ranking takes its own
        sampled = dataclasses.replace(sampled, time_budget_s=max(left_s, POLL_S))
    try:
        found = search_layered(sample, sampled, modes, progress=_Progress(started), stages=stages,
                               compared=compared[1] if compared is not None else None)
    except KeyboardInterrupt:
        raise Interrupted("interrupted; the workers were stopped") from None
    section = layered_section(found, rates)
    if compared is not None:
        section["compared"] = _compared_row(compared, found, sample, sampled, rates, section["chosen"])
    print("\n".join(layered_table(section)))
    ranking = {"format": FORMAT, "graph": str(document.get("name", Path(args.graph).stem)),
               "devices": options.devices, "topology": options.topology, "by_layer": section}
    if args.output:
        (Path(args.output) / "ranking.json").write_text(document_text(ranking))
    best = found.best
    if best is None:
        raise _no_plan(found)
    if args.rank_only:
        return 0
    return _deliver_best(args, document, options, best, found)


def _no_plan(found: LayeredSearch) -> Exception:
    if found.counts.get("unsolved"):
        return InfeasibleError(f"the search's time budget ran out before a configuration had a plan within the memory "
                               f"budget ({found.counts['unsolved']} of {found.counts['keys']} keys were not solved)")
    return InfeasibleError("no configuration has a plan within the memory budget")


def _deliver_best(args: argparse.Namespace, document: dict[str, Any], options: SearchOptions, best: PricedLayered,
                  found: LayeredSearch) -> int:
    """The winning configuration planned on the whole graph (as `plan --pipeline S` plans it)."""
    task, configuration = best.configuration.task, best.configuration
    mesh = task.candidate.mesh
    print(f"planning the whole graph as the winner says: {task.stages} stage(s) of {task.candidate.label}, "
          f"{task.microbatches} microbatch(es), {configuration.schedule_text}, recompute {task.recompute}",
          file=sys.stderr, flush=True)
    graph = with_recomputation(load_graph(document, mesh), task.recompute, mesh)
    settings = dataclasses.replace(options.settings, microbatches=task.microbatches)
    emit = tuple(dict.fromkeys(part.strip() for part in args.emit.split(",") if part.strip()))
    common = dict(emit=emit, dialect=args.dialect, arguments=args.arguments, verify=args.verify,
                  optimize_collectives=not args.no_collective_opt)
    if task.stages == 1:
        hardware = bind_candidate(SearchInputs(document, options.topology, options.settings), task.candidate)
        result = make_plan(graph, mesh, hardware, settings)
        delivered = deliver(result, hardware, args.topology, nodes=task.candidate.nodes,
                            slice_shape=task.candidate.slice_shape, mapping=task.candidate.mapping_json, **common)
        phases = result.phases
    else:
        placement = bind_stages(options.topology, options.devices, task.stages, task.candidate)
        assert placement is not None, "the search bound the same machine"
        pipelined = plan_pipeline(graph, mesh, placement.hardware, settings,
                                  PipelineSettings(task.stages, configuration.schedule, configuration.chunks))
        delivered = deliver(pipelined.result, placement.hardware, args.topology, nodes=placement.nodes,
                            slice_shape=placement.slice_shape, mapping=placement.mapping, pipeline=pipelined.cut,
                            **common)
        delivered.document["pipeline"] = pipelined.to_json()
        phases = pipelined.result.phases
    delivered.document["search"] = {"ranking": "ranking.json", "method": "layer sample",
                                    "ranked_step_s": best.pipeline.step_s,
                                    "certified_lower_bound_step_s": found.certified_bound_s}
    record_recompute(delivered.document, task.recompute)
    written = write_deliverables(delivered, args.output, phases)
    print_summary(delivered.document, ([Path(args.output) / "ranking.json"] if args.output else []) + written)
    return 1 if delivered.document["verification"]["status"] == "failed" else 0


def _compared_task(text: str, sample: LayerSample, sample_graph: Graph, options: SearchOptions
                   ) -> tuple[Layout, SampleTask, str, int]:
    """The user's layout as a key of the search whose sample has Megatron's shardings pinned, and
    the schedule and V it runs."""
    layout = parse_layout(text)
    batch = math.gcd(*batch_sizes(sample_graph)) or 1  # the sequences: a routed MoE's token groups are a batch too
    task, schedule, chunks, pinned = compared_key(layout, sample, options.topology, options.devices, batch)
    print(f"comparing {layout.words}: its sample is solved with Megatron-LM's shardings pinned, beside the search's",
          file=sys.stderr, flush=True)
    return layout, dataclasses.replace(task, graph_document=pinned), schedule, chunks


def _compared_row(compared: tuple[Layout, SampleTask, str, int], found: LayeredSearch, sample: LayerSample,
                  options: SearchOptions, rates: Throughput, chosen: dict[str, Any] | None) -> dict[str, Any]:
    """The compared layout priced, with its rank among the search's configurations and, term by
    term, how it differs from the chosen one."""
    layout, task, schedule, chunks = compared
    answer = found.compared
    assert answer is not None, "the search solved or stopped the compared task"
    if "prices" not in answer:
        outcome = next(iter(answer))
        return {"layout": layout.words, "outcome": outcome, "reason": answer[outcome]}
    key = KeyOutcome(task, 0.0, outcome="solved", bound_s=answer["bound_s"] / task.stages, solved=answer)
    placement = bind_stages(options.topology, options.devices, task.stages, task.candidate)
    priced = price_key(key, answer["prices"], sample, placement, options.settings.memory_budget_bytes, math.inf,
                       only=(schedule, chunks))[0]
    row = {"layout": layout.words, **configuration_json(None, priced, answer["roles"][priced.variant], rates)}
    if not priced.fits:
        return row
    row["rank"] = 1 + sum(1 for p in found.priced if p.fits and p.step_s < priced.step_s)
    return {**row, "behind_chosen": behind(row, chosen)} if chosen is not None else row


class _Progress:
    def __init__(self, started: float) -> None:
        self.started = started

    def __call__(self, done: int, total: int, key: KeyOutcome) -> None:
        task = key.task
        print(f"  {time.perf_counter() - self.started:6.1f}s sample {done}/{total}: S {task.stages}, "
              f"{task.candidate.label}, M {task.microbatches}, recompute {task.recompute}: {key.outcome}",
              file=sys.stderr, flush=True)
