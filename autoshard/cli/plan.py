"""`autoshard plan GRAPH.json --mesh ... --topology ... -o OUTDIR`: find, price and write a plan."""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from pathlib import Path
from typing import Any

from autoshard.cli.args import (add_hardware_args, hardware_from_args, integer_flag, mesh_from_args, number_flag,
                                parse_bytes, parse_slice)
from autoshard.cli._like import Decisions, apply_decisions, fill_defaults, read_decisions
from autoshard.cli._pipeline_flags import (add_pipeline_args, flagged, pipeline_hardware, pipeline_settings,
                                           print_pipeline)
from autoshard.delivery.deliver import Deliverables, deliver, ir_request_problems, placement_options
from autoshard.delivery.document import plan_document
from autoshard.errors import InfeasibleError, InputError, Interrupted, Problem
from autoshard.graph.builder import document_text
from autoshard.graph.model import Graph
from autoshard.graph.recompute import MODES, Recompute, record_recompute, with_recomputation
from autoshard.graph.schema import graph_from_json, load_graph, read_json
from autoshard.graph.summary import si, size
from autoshard.mesh import Mesh
from autoshard.numerals import parse_real
from autoshard.phases import PhaseTimes
from autoshard.pipeline import write_trace
from autoshard.planning.compose import plan_layer_once
from autoshard.planning.costs import Hardware
from autoshard.planning.formulation import Weights, weight_name_problem
from autoshard.planning.make_plan import MAX_SEED, BestSoFar, PlanResult, SolveSettings, make_plan, memory_budget_problem
from autoshard.planning.pipeline_plan import (FIT_MARGIN, PipelinedPlan, check_budget, checked_orders, price_pipeline,
                                              stage_budget_bytes, stage_plan)
from autoshard.planning.pipeline_stages import layer_order
from autoshard.planning.recompute_choice import Choice, choose_modes, placements, position_costs
from autoshard.sim.verify import VERIFY_POLICIES, policy_problem


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("plan", help="find a sharding plan for a graph on a mesh")
    parser.add_argument("graph", help="graph JSON (format autoshard.graph/v1)")
    add_hardware_args(parser, mesh_required=False)
    add_solve_args(parser)
    parser.add_argument("--microbatches", type=integer_flag, default=1,
                        help="run forward and backward on 1/M of the batch, M times, accumulating the gradients; "
                             "the optimizer once (default 1; needs inputs that declare a batch_dim)")
    parser.add_argument("--layer-once", action="store_true",
                        help="solve each kind of repeated layer once and compose the plan (the bound is summed "
                             "over the parts); needs ops with a `layer`")
    add_recompute_arg(parser, auto="each planned, the fastest within memory kept; with --pipeline also a mode per "
                                   "layer, fitted to each stage's microbatches in flight")
    add_pipeline_args(parser)
    parser.add_argument("--like", metavar="PLAN.json",
                        help="take another plan's layout decisions: mesh, topology and nodes or slice, pipeline "
                             "stages, schedule and virtual stages, microbatches, each virtual stage's layers and "
                             "each layer's recomputation (e.g. a narrow version of a model planned as the wide one "
                             "was); a flag given as well must agree")
    parser.add_argument("--balanced-over", metavar="N|auto", type=_layout_flag,
                        help="plan the graph in the load-balanced causal layout for N context-parallel devices "
                             "(the sequence in 2N chunks, device i of a contiguous split holding chunks i and "
                             "2N-1-i); auto: plan the sequence's own order and the layout over each mesh axis's "
                             "size, keep the fastest. The graph planned is written beside plan.json as graph.json: "
                             "emit and simulate with it, and feed the inputs plan.json lists under "
                             "roles.sequence_layout in the layout's order")
    # None: not given, so --like may set it (`fill_defaults` gives the rest their defaults)
    parser.set_defaults(run=run, mesh=None, topology=None, recompute=None, microbatches=None)


def _layout_flag(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return integer_flag(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected a whole number or auto, got {text!r}") from None


LAYOUT_GRAPH = "graph.json"  # the graph planned in the balanced layout, written beside plan.json


def causal_layouts(args: argparse.Namespace, graph: Graph, mesh: Mesh) -> list[tuple[int | None, Graph, dict | None]]:
    """The layouts to plan: (devices balanced over or None for the sequence's own order, the
    graph so laid out, its document when rewritten). `--balanced-over auto` offers the own order
    and the layout over each mesh axis's size the graph takes (the others said and skipped)."""
    wanted = getattr(args, "balanced_over", None)
    if wanted is None:
        return [(None, graph, None)]
    from autoshard.planning.sequence_layout import balance_layout
    document = read_json(args.graph)
    auto = wanted == "auto"
    found: list[tuple[int | None, Graph, dict | None]] = [(None, graph, None)] if auto else []
    for n in sorted({size for size in mesh.shape if size > 1}) if auto else [wanted]:
        try:
            balanced = balance_layout(document, n)
        except InputError as error:
            if not auto:  # the layout's own problems are the flag's; the graph's are at their ops
                raise InputError([dataclasses.replace(p, where="--balanced-over") if p.where == "balanced_over"
                                  else p for p in error.problems]) from None
            print(f"  layout balanced over {n}: not offered: {error.problems[0].message}", file=sys.stderr, flush=True)
            continue
        found.append((n, graph_from_json(balanced, mesh), balanced))
    return found


def add_recompute_arg(parser: argparse.ArgumentParser, auto: str) -> None:
    """`--recompute`; `auto` says what its auto mode does (the mode is offered when it says something)."""
    parser.add_argument("--recompute", default="none", choices=(*MODES, "auto") if auto else MODES, metavar="MODE",
                        help="activations computed again in the backward instead of kept: none (default), selective "
                             "(the attention core: scores, softmax, dropout), full (every layer keeps its input only), "
                             "routed (as full, keeping the routed experts' dispatched tokens and outputs)"
                             + (f" or auto ({auto})" if auto else "") + "; needs a training step with layers")


def add_solve_args(parser: argparse.ArgumentParser, workers: int = 2) -> None:
    """The solver's flags and what to write: shared by `plan` and `search`."""
    parser.add_argument("--memory-budget", help="per-device memory limit, e.g. 40GiB (default: the chip's HBM)")
    parser.add_argument("--time-limit", type=number_flag, default=30.0, help="solver time limit in seconds (default 30)")
    parser.add_argument("--gap-limit", type=number_flag, default=SolveSettings.gap_limit,
                        help="stop once (cost - bound) / cost is at most this (default %(default)g; 0: prove "
                             "optimality or use the whole time limit)")
    parser.add_argument("--workers", type=integer_flag, default=workers, help="solver threads (default %(default)s)")
    parser.add_argument("--seed", type=integer_flag, default=0)
    parser.add_argument("--deterministic", action="store_true",
                        help="bound the solver by a fixed amount of work instead of the clock: the same graph, "
                             "flags and seed give the same plan.json (apart from its timing fields) on any machine; "
                             "--time-limit no longer stops it")
    parser.add_argument("--weights", default="time=1",
                        help="objective weights, e.g. time=1,comm_s_per_byte=1e-11: time (seconds of objective per "
                             "second of step time), comm_s_per_byte (per byte communicated per device), "
                             "memory_s_per_byte (per byte held per device); default time=1")
    parser.add_argument("--mesh-order-splits", action="store_true",
                        help="a dim split over several mesh axes takes them in mesh order only: plans whose every "
                             "sharding has DTensor placements (plan.json's dtensor)")
    parser.add_argument("-o", "--output", help="directory to write plan.json (and IR) into")
    parser.add_argument("--emit", default="", help="IR to write beside plan.json: annotated, partitioned or both "
                                                   "(comma-separated; needs -o)")
    parser.add_argument("--dialect", default="mesh", help="IR spelling: mesh (default) or shard (upstream LLVM 22)")
    parser.add_argument("--arguments", default="local",
                        help="partitioned IR's function arguments: local shards (default) or global values sliced "
                             "by process index")
    parser.add_argument("--verify", default="auto",
                        help="run the partitioned plan in the simulator and compare with the unsharded graph: "
                             "auto (default: plans small enough to simulate in seconds), always, never; "
                             "exit 1 if it fails")
    parser.add_argument("--no-collective-opt", action="store_true",
                        help="keep the partitioned program's collectives as planned (default: fold, reassociate "
                             "and move them where that lowers communication time)")


def parse_weights(text: str, problems: list[Problem]) -> Weights:
    """`time=1,comm_s_per_byte=1e-11`: each weight in seconds of objective per unit it weighs."""
    values: dict[str, float] = {}
    seen: set[str] = set()
    for part in text.split(","):
        name, _, value = (piece.strip() for piece in part.partition("="))
        wrong = weight_name_problem(name)
        if wrong is None and name in seen:
            wrong = f"{name} is given twice; give each weight once"
        seen.add(name)
        if wrong is not None:
            problems.append(Problem("--weights", wrong))
            continue
        try:
            values[name] = parse_real(value, "--weights")  # Weights says which values it takes
        except InputError as error:
            problems.append(Problem("--weights", f"{name}: {error.problems[0].message}"))
    try:
        weights = Weights(**values)
    except InputError as error:
        problems.extend(Problem("--weights", p.message) for p in error.problems)
        return Weights()
    if weights.problem() is not None:
        problems.append(Problem("--weights", weights.problem()))
    return weights


def checked_settings(args: argparse.Namespace) -> tuple[SolveSettings, tuple[str, ...]]:
    """The solver settings and IR stages the flags ask for; every flag problem at once, before
    any solving. Creates the output directory, so a bad -o is found now, not after the solve."""
    problems: list[Problem] = []
    if not (math.isfinite(args.time_limit) and args.time_limit > 0):
        problems.append(Problem("--time-limit", f"must be a positive number of seconds, got {args.time_limit:g}"))
    if not (math.isfinite(args.gap_limit) and 0 <= args.gap_limit < 1):
        problems.append(Problem("--gap-limit", f"must be a number in [0, 1), got {args.gap_limit:g}"))
    if args.workers < 1:
        problems.append(Problem("--workers", f"must be at least 1, got {args.workers}"))
    microbatches = getattr(args, "microbatches", 1)  # `search` has no such flag yet
    if microbatches < 1:
        problems.append(Problem("--microbatches", f"must be at least 1, got {microbatches}"))
    if microbatches > 1 and getattr(args, "layer_once", False):
        problems.append(Problem("--microbatches", "composing layers solved once does not take microbatches yet; "
                                                  "drop --layer-once or --microbatches"))
    if not 0 <= args.seed <= MAX_SEED:
        problems.append(Problem("--seed", f"must be in [0, 2**63 - 1], got {args.seed}"))
    weights = parse_weights(args.weights, problems)
    budget = None
    if args.memory_budget:
        try:
            budget = parse_bytes(args.memory_budget, "--memory-budget")
        except InputError as error:
            problems.extend(error.problems)
        if budget is not None and memory_budget_problem(budget) is not None:
            problems.append(Problem("--memory-budget", memory_budget_problem(budget)))
    stages = tuple(dict.fromkeys(part.strip() for part in args.emit.split(",") if part.strip()))
    if stages and not args.output:
        problems.append(Problem("--emit", "writing IR needs an output directory (-o DIR)"))
    problems += ir_request_problems(stages, args.dialect, args.arguments,
                                    {"emit": "--emit", "dialect": "--dialect", "arguments": "--arguments"})
    if args.verify not in VERIFY_POLICIES:
        problems.append(policy_problem(args.verify, "--verify"))
    if args.output and not problems:
        try:
            Path(args.output).mkdir(parents=True, exist_ok=True)
        except OSError as error:
            problems.append(Problem("-o", f"cannot create the output directory {args.output!r}: {error.strerror}"))
    if problems:
        raise InputError(problems)
    settings = SolveSettings(time_limit_s=args.time_limit, gap_limit=args.gap_limit, workers=args.workers,
                             seed=args.seed, memory_budget_bytes=budget, weights=weights,
                             deterministic=args.deterministic, mesh_order_splits=args.mesh_order_splits,
                             microbatches=microbatches)
    return settings, stages


class ProgressLine:
    """Prints the incumbent, bound and gap to stderr once the solve has run for a second, at most
    once a second, and at once when the first plan within memory is found."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.last = 0.0
        self.found = False

    def __call__(self, phase: str, cost: float, bound: float, elapsed_s: float) -> None:
        now = time.perf_counter() - self.started
        first = math.isfinite(cost) and not self.found
        self.found = self.found or first
        if first:
            print(f"  solving: first plan within memory after {elapsed_s:.2f} s of solving", file=sys.stderr,
                  flush=True)
        if now < 1.0 or now - self.last < 1.0:
            return
        self.last = now
        found = math.isfinite(cost)
        parts = [f"{now:6.1f}s {phase}", f"incumbent {cost / 1e12:.6g} s" if found else "no plan within memory yet"]
        if bound > float("-inf"):
            parts.append(f"bound {bound / 1e12:.6g} s")
            if found and cost > 0:
                parts.append(f"gap {100 * max(cost - bound, 0) / cost:.2f}%")
        print("  solving: " + ", ".join(parts), file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    like = like_decisions(args)
    phases = PhaseTimes(announce=lambda text: print(f"  {text}", file=sys.stderr, flush=True))
    attempt = Attempt("none" if args.recompute == "auto" else args.recompute)
    chosen: Attempt | None = None  # with auto, the fastest recomputation planned so far
    try:  # from the first step: a Ctrl-C while the graph loads is said as any before a plan is found
        with phases.phase("load"):  # and validate: the graph, the mesh, the machine, every flag
            mesh = mesh_from_args(args)
            problems: list[Problem] = []
            pipeline = pipeline_settings(args, problems)
            if problems:
                raise InputError(problems)
            graph = load_graph(args.graph, mesh)
            layouts = causal_layouts(args, graph, mesh)
            if len(layouts) > 1 and args.recompute == "auto" and pipeline is not None:
                raise InputError("--balanced-over auto with --recompute auto and --pipeline: choose one of the two "
                                 "automatically (a mode per layer is fitted to one layout's plans)", "--balanced-over")
            layout_documents = {n: document for n, _, document in layouts}
            graph = layouts[0][1]  # the one layout's graph (with auto, the sequence's own order)
            try:
                rewritten = [(mode, recomputed, n) for n, laid, _ in layouts for mode, recomputed in
                             (list(recomputations(laid, args.recompute, mesh).items())
                              if isinstance(args.recompute, str)
                              else [(args.recompute, with_recomputation(laid, args.recompute, mesh))])]
                part_at = like.part_at(graph) if like is not None else None
            except InputError as error:
                raise InputError([Problem(p.where if p.where == "--like" else "--recompute", p.message)
                                  for p in error.problems]) from None
            if args.recompute in ("selective", "full") and rewritten[0][1] is graph:
                print(f"  recompute {args.recompute}: no layer has a value to compute again (a fused attention "
                      f"already recomputes its scores); the step is planned as it is", file=sys.stderr, flush=True)
            if pipeline is None:
                hw = hardware_from_args(args, mesh)
            else:  # the stages against the graph's layers first; the machine is the stages times one's mesh
                try:
                    checked_orders(graph, pipeline, args.microbatches)
                    hw = pipeline_hardware(args, mesh, pipeline.stages)
                except InputError as error:
                    raise flagged(error) from None
            settings, stages = checked_settings(args)
        attempts: list[Attempt] = []
        for mode, recomputed, n in rewritten:
            attempt = Attempt(mode, part_at, layout=n, layouts_compared=len(layouts) > 1)
            attempts.append(attempt)
            chosen = attempt.run(recomputed, mesh, hw, settings, pipeline, args.layer_once, phases, chosen,
                                 announce=len(rewritten) > 1)
        if args.recompute == "auto" and pipeline is not None:
            choice = mixed_recompute(graph, attempts, settings, hw)
            if choice is not None:
                per_layer = choice.per_layer(layer_order(graph))
                attempt = Attempt(per_layer, choice.part_at)
                chosen = attempt.run(with_recomputation(graph, per_layer, mesh), mesh, hw, settings, pipeline,
                                     args.layer_once, phases, chosen, announce=True)
        if chosen is None:
            raise InfeasibleError(f"no feasible plan with any recomputation "
                                  f"({', '.join(sorted({mode_words(mode) for mode, _, _ in rewritten}))})")
        attempt = chosen
        result, pipelined = chosen.result, chosen.pipelined
        delivered = deliver(result, hw, args.topology, emit=stages, dialect=args.dialect, arguments=args.arguments,
                            verify=args.verify, optimize_collectives=not args.no_collective_opt,
                            nodes=args.nodes, slice_shape=parse_slice(args.slice),
                            pipeline=pipelined.cut if pipelined is not None else None)
        if pipelined is not None:
            delivered.document["pipeline"] = pipelined.to_json()
        if chosen.graph is not graph:  # the graph as planned is the rewritten one
            record_recompute(delivered.document, chosen.mode)
        written = write_deliverables(delivered, args.output, phases)
        written += write_layout_graph(layout_documents.get(chosen.layout), args.output)
        if pipelined is not None and args.trace:
            written.append(write_trace(pipelined.timeline, args.trace))
    except KeyboardInterrupt:
        found = attempt.result or attempt.best.result()
        if chosen is not None and chosen is not attempt and (found is None or chosen.step_s <= step_of(found)):
            attempt, found = chosen, chosen.result  # with auto: a finished plan beats a running one's incumbent
        stopped = interrupted(found, attempt.mode, args, phases)
        if found is not None and args.output:
            write_layout_graph(layout_documents.get(attempt.layout), args.output)
        raise stopped from None
    print_summary(delivered.document, written)
    return 1 if delivered.document["verification"]["status"] == "failed" else 0


def like_decisions(args: argparse.Namespace) -> Decisions | None:
    """With --like, its plan's decisions, set on the flags; the flags not set take their defaults."""
    decisions = None
    if args.like is not None:
        document = read_json(args.like)
        try:
            decisions = read_decisions(document)
        except InputError as error:  # the plan's fields, said to be --like's
            raise InputError([Problem(f"--like {args.like} {p.where}", p.message) for p in error.problems]) from None
        apply_decisions(args, decisions)
    fill_defaults(args)
    if args.mesh is None:
        raise InputError("required: the mesh axes, e.g. dp=2,tp=4 (or --like PLAN.json for another plan's)", "--mesh")
    return decisions


def recomputations(graph: Graph, recompute: str, mesh: Mesh | None) -> dict[str, Graph]:
    """Mode -> the graph rewritten so: the one asked for, or for `auto` each mode that changes the
    graph (a step whose attention is fused has no selective one: it is the step as it is)."""
    if recompute != "auto":
        return {recompute: with_recomputation(graph, recompute, mesh)}
    found: dict[str, Graph] = {}
    for mode in MODES:
        rewritten = with_recomputation(graph, mode, mesh)
        if mode == "none" or rewritten is not graph:
            found[mode] = rewritten
    return found


def mixed_recompute(graph: Graph, attempts: list["Attempt"], settings: SolveSettings,
                    hw: Hardware) -> Choice | None:
    """A mode per layer from the uniform modes' pipelined plans, fitting or not (each mode's first
    solve, its shardings its own, and its last, fitted to the budget), on the cut of each in
    turn, the one of least estimated bottleneck kept (the mixed plan is cut there too, so its
    stages hold what the choice fitted); None when no cut has a choice that fits or the choice
    is one of the uniform modes (already planned)."""
    priced = [(a.mode, pipelined) for a in attempts if isinstance(a.mode, str) and a.unbent is not None
              for pipelined in ((a.unbent,) if a.priced is a.unbent else (a.unbent, a.priced))]
    if len({mode for mode, _ in priced}) < 2:
        return None
    costs = [(mode, position_costs(pipelined)) for mode, pipelined in priced]
    budget = stage_budget_bytes(settings, hw) * FIT_MARGIN  # the mixed plan's own shardings will differ a little
    found = [choice for _, pipelined in priced
             if (choice := choose_modes(costs, pipelined.orders, placements(pipelined), budget)) is not None]
    if not found:
        print("  recompute per layer: no mode per layer fits every stage on the uniform plans' prices",
              file=sys.stderr, flush=True)
        return None
    best = min(found, key=lambda choice: max(choice.stage_seconds))
    if len(set(best.modes)) == 1:
        print(f"  recompute per layer: {best.modes[0]} for every layer is the best fit on the uniform plans' prices "
              f"(planned above)", file=sys.stderr, flush=True)
        return None
    return best


def mode_words(mode: Recompute) -> str:
    """A recomputation as the progress lines say it: the mode, or how many layers take each."""
    if isinstance(mode, str):
        return mode
    counts = {m: sum(1 for value in mode.values() if value == m) for m in MODES}
    return "per layer (" + ", ".join(f"{m} x{n}" for m, n in counts.items() if n) + ")"


class Attempt:
    """One recomputation's plan (a pipelined one with `--pipeline`), and the best so far while it solves."""

    def __init__(self, mode: Recompute, part_at: tuple[int, ...] | None = None, layout: int | None = None,
                 layouts_compared: bool = False) -> None:
        self.mode, self.best = mode, BestSoFar()
        # the causal layout planned (the devices it balances; None: the sequence's own order), named
        # in the announcements when several are compared
        self.layout, self.layouts_compared = layout, layouts_compared
        self.part_at = part_at  # the cut (virtual stage per layer position), when fixed
        self.graph: Graph | None = None
        self.result: PlanResult | None = None
        self.pipelined: PipelinedPlan | None = None
        # the first solve's pipelined plan, priced whether its stages fit or not: its shardings are
        # the mode's own, not those a shrunk budget bends every layer to for the fullest stage
        self.unbent: PipelinedPlan | None = None
        self.priced: PipelinedPlan | None = None  # the last solve's, priced whether its stages fit or not

    def run(self, graph: Graph, mesh: Mesh, hw: Hardware, settings: SolveSettings, pipeline: Any, layer_once: bool,
            phases: PhaseTimes, chosen: "Attempt | None", announce: bool) -> "Attempt | None":
        """Solve; the faster of this plan and `chosen` (an infeasible one said when `announce`,
        else raised)."""
        words = mode_words(self.mode)
        if self.layouts_compared:
            words += f", {'the sequence in its own order' if self.layout is None else f'balanced over {self.layout}'}"
        if announce:
            print(f"  recompute {words}: planning", file=sys.stderr, flush=True)
        try:
            self.solve(graph, mesh, hw, settings, pipeline, layer_once, phases)
        except InfeasibleError as error:
            if not announce:
                raise
            print(f"  recompute {words}: infeasible: {error}", file=sys.stderr, flush=True)
            return chosen
        if announce:
            print(f"  recompute {words}: step {self.step_s:.6g} s", file=sys.stderr, flush=True)
        return self if chosen is None or self.step_s < chosen.step_s else chosen

    def solve(self, graph: Graph, mesh: Mesh, hw: Hardware, settings: SolveSettings, pipeline: Any,
              layer_once: bool, phases: PhaseTimes) -> None:
        self.graph = graph
        if pipeline is not None:
            try:
                orders = checked_orders(graph, pipeline, settings.microbatches)
                rounds: list[PlanResult] = []
                self.result = stage_plan(graph, mesh, hw, settings, orders, progress=ProgressLine(), phases=phases,
                                         best_so_far=self.best, solved=rounds, part_at=self.part_at)
                with phases.phase("pipeline"):
                    priced = price_pipeline(self.result, mesh, hw, orders, math.inf, part_at=self.part_at)
                    self.unbent = priced if rounds[0] is self.result else price_pipeline(
                        rounds[0], mesh, hw, orders, math.inf, part_at=self.part_at)
            except InputError as error:
                raise flagged(error) from None
            self.priced = priced
            budget = stage_budget_bytes(settings, hw)
            check_budget(priced.memory, budget)
            self.pipelined = dataclasses.replace(priced, budget_bytes=budget)
        elif layer_once:
            self.result = plan_layer_once(graph, mesh, hw, settings, phases=phases)
        else:
            self.result = make_plan(graph, mesh, hw, settings, progress=ProgressLine(), phases=phases,
                                    best_so_far=self.best)

    @property
    def step_s(self) -> float:
        """What the choice between recomputations compares: the pipelined step, or the plan's."""
        if self.pipelined is not None:
            return self.pipelined.timeline.step_s
        return step_of(self.result)


def step_of(result: PlanResult) -> float:
    return result.report.step_s


def interrupted(found: PlanResult | None, recompute: str, args: argparse.Namespace, phases: PhaseTimes) -> Interrupted:
    """Stopped by a signal: the best plan found so far is written as plan.json, priced but
    neither verified nor emitted (its solver status `interrupted` unless the solve had ended)."""
    if found is None and args.layer_once:
        return Interrupted("interrupted; --layer-once has no plan before it has composed one; nothing was written")
    if found is None:
        return Interrupted("interrupted before the solver had found a plan; nothing was written")
    said = f"solver status {found.solver['status']}, objective {found.solver['objective_s']:.6g} s"
    if not args.output:
        return Interrupted(f"interrupted; the best plan found so far ({said}) was not written (no -o)")
    document = plan_document(found, args.topology)
    document["topology_options"] = placement_options(args.nodes, parse_slice(args.slice))
    document["verification"] = {"status": "skipped", "reason": "interrupted before verification"}
    record_recompute(document, recompute)
    document["phases"] = phases.to_json()
    written = write_deliverables(Deliverables(document, {}), args.output, phases)
    return Interrupted(f"interrupted; wrote the best plan found so far to {written[0]} ({said})")


def write_deliverables(delivered: Deliverables, output: str | None, phases: PhaseTimes) -> list[Path]:
    """plan.json and the IR into `output` (if given), the writing timed as the plan's last phase;
    returns the files written."""
    document = delivered.document
    names = ["plan.json"] + [f"{stage}.mlir" for stage in delivered.ir]
    with phases.phase("writing"):
        del document["phases"]  # goes last, once writing is timed too
        body = document_text(document)
        if output:
            for stage, text in delivered.ir.items():
                (Path(output) / f"{stage}.mlir").write_text(text)
    document["phases"] = phases.to_json()
    if output:
        (Path(output) / "plan.json").write_text(_with_phases(body, document["phases"]))
    return [Path(output) / name for name in names] if output else []


def write_layout_graph(document: dict | None, output: str | None) -> list[Path]:
    """The graph as planned in the balanced layout, beside plan.json (none for the own order)."""
    if document is None or not output:
        return []
    path = Path(output) / LAYOUT_GRAPH
    path.write_text(document_text(document))
    return [path]


def _with_phases(body: str, phases: dict[str, Any]) -> str:
    """`body` (`document_text` of the document) with `phases` as its last section, without
    serialising the rest again."""
    return body[:-3] + ",\n" + document_text({"phases": phases})[2:]


def print_summary(document: dict[str, Any], written: list[Path]) -> None:
    totals, solver = document["totals"], document["solver"]
    mesh = ",".join(f"{a['name']}={a['size']}" for a in document["mesh"]["axes"])
    print(f"plan for {document['graph']} on mesh {mesh} "
          f"({document['topology']}): {solver['status']}, gap {100 * solver['gap']:.2f}% "
          f"(objective {solver['objective_s']:.6g} s, bound {solver['lower_bound_ps'] / 1e12:.6g} s), "
          f"solved in {solver['solve_s']:.2f} s")
    composition = solver.get("composition")
    if composition and composition["kinds"] == 0:
        print("  no two layers form the same problem: the whole graph was solved")
    elif composition:
        print(f"  composed from {composition['kinds']} layer kind(s) solved once for {composition['layers']} layers; "
              f"reshardings between parts {composition['boundary_ps'] / 1e12:.4g} s")
    if document.get("microbatches", 1) > 1:
        print(f"  {document['microbatches']} microbatches: forward and backward once per microbatch, gradients "
              f"accumulated, the optimizer once per step")
    if "pipeline" in document:
        print("  the whole graph planned on one stage's mesh, each stage running its part of it:")
    print(f"  step time {totals['step_s'] * 1e3:.4g} ms = compute {totals['compute_s'] * 1e3:.4g} ms "
          f"+ communication {totals['communication_s'] * 1e3:.4g} ms ({si(totals['communication_bytes'], 'B')} per device)")
    print(f"  overlapped: step {totals['overlapped_step_s'] * 1e3:.4g} ms, communication hidden behind compute "
          f"{totals['hidden_s'] * 1e3:.4g} ms, exposed {totals['exposed_s'] * 1e3:.4g} ms")
    for axis, seconds in sorted(totals["communication_s_per_axis"].items()):
        print(f"    axis {axis}: {seconds * 1e3:.4g} ms, {si(totals['communication_bytes_per_axis'][axis], 'B')} "
              f"(hidden {totals['hidden_s_per_axis'][axis] * 1e3:.4g} ms, "
              f"exposed {totals['exposed_s_per_axis'][axis] * 1e3:.4g} ms)")
    print(f"  peak memory {size(totals['peak_memory_bytes_per_device'])} per device at op {totals['peak_at']['op']!r} "
          f"(parameters {size(totals['parameter_bytes_per_device'])}, "
          f"activations {size(totals['activation_bytes_at_peak_per_device'])}; budget {size(solver['memory_budget_bytes'])})")
    print_roles(document["roles"])
    print(f"  {len(document['reshardings'])} reshardings; problem: {solver['problem']['nodes']} nodes, "
          f"{solver['problem']['edges']} edges, {solver['problem']['strategies']} strategies")
    optimized = document.get("collective_optimizations")
    if optimized and optimized["changes"]:
        print(f"  collective optimisations: {len(optimized['changes'])} rewrite(s), communication "
              f"{optimized['communication_s_before'] * 1e3:.4g} ms -> {optimized['communication_s_after'] * 1e3:.4g} ms "
              f"in the partitioned program")
    if "pipeline" in document:
        print_pipeline(document["pipeline"])
    verification = document["verification"]
    if verification["status"] == "skipped":
        print(f"  simulator: not run ({verification['reason']})")
    else:
        print(f"  simulator: {verification['summary']}")
    if written:
        print(f"  wrote {', '.join(str(path) for path in written)}")


AXIS_ROLE_WORDS = {"data": "data", "fully_sharded_data": "fully-sharded data", "tensor": "tensor", "context": "context",
                   "expert": "expert", "pipeline": "pipeline"}
TENSOR_ROLE_WORDS = {"parameter": "parameters", "gradient": "gradients", "optimizer_state": "optimizer state",
                     "activation": "activations"}


def print_roles(roles: dict[str, Any], indent: str = "  ") -> None:
    """Two lines of plan.json's `roles`: what each mesh axis does, in which op classes, and the
    bytes one device holds per tensor role."""
    axes = []
    for axis, found in roles["axes"].items():
        said = ", ".join(f"{AXIS_ROLE_WORDS[role]} ({', '.join(classes)})" for role, classes in found.items())
        axes.append(f"{axis} = {said or 'replicated'}")
    note = "" if roles["batch_declared"] else " (no input declares a batch dim: data splits read as tensor)"
    print(f"{indent}axis roles: {'; '.join(axes)}{note}")
    held = ", ".join(f"{TENSOR_ROLE_WORDS[role]} {size(entry['bytes_per_device'])}"
                     for role, entry in roles["tensors"].items() if entry["tensors"])
    print(f"{indent}per device: {held} (state as stored; gradients and activations as produced, summed over the step)")
    layout = roles.get("sequence_layout")
    if layout is not None:
        n = layout["balanced_over"]
        splits = sorted({(tuple(a["query_axes"]), round(a["busiest_over_least_work"], 3))
                         for a in layout["attention"].values()})
        said = "; ".join(f"queries over {','.join(axes) or 'no axis'}: causal work busiest/least {ratio:g}"
                         for axes, ratio in splits)
        print(f"{indent}sequence layout: load-balanced causal over {n} ({2 * n} chunks; device i of a contiguous "
              f"split over {n} holds chunks i and {2 * n - 1} - i): {said}")
