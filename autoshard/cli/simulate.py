"""`autoshard simulate GRAPH.json --plan PLAN.json [--mesh ...] [--seed S]`: partition the plan, run
it on every device in numpy (a pipelined plan stage by stage in its schedule's order) and compare
with the unsharded graph; exit 1 if they differ."""

from __future__ import annotations

import argparse
import json
import sys

from autoshard.cli.args import graph_of_plan, hardware_from_args, integer_flag, parse_bytes, parse_slice
from autoshard.delivery.deliver import partitioned_program
from autoshard.errors import InputError, Problem
from autoshard.graph.schema import read_json
from autoshard.mesh import Mesh
from autoshard.planning.hardware import bind_hardware
from autoshard.planning.microbatches import microbatch, stated_microbatches
from autoshard.planning.pipeline_cut import read_cut
from autoshard.planning.plan import check_plan_mesh, stated_mesh
from autoshard.planning.plan_contract import read_plan
from autoshard.resharding import Price, bytes_moved_price
from autoshard.sim.microbatch import simulate_microbatched
from autoshard.sim.pipelined import simulate_pipelined
from autoshard.sim.program import simulate_program
from autoshard.spmd.staged import stage_program


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("simulate", help="run a plan on every device in numpy and compare with the unsharded graph")
    parser.add_argument("graph", help="graph JSON (format autoshard.graph/v1)")
    parser.add_argument("--plan", required=True, help="plan JSON (format autoshard.plan/v1)")
    parser.add_argument("--mesh", help="mesh axes, e.g. dp=2,tp=4 (default: the plan's mesh)")
    parser.add_argument("--seed", type=integer_flag, default=0, help="seed of the random inputs (default 0)")
    add_program_args(parser)
    parser.add_argument("--max-memory", default="2GiB",
                        help="refuse simulations needing more host memory than this (default 2GiB)")
    parser.add_argument("--declared-dtypes", action="store_true",
                        help="compute floats in their declared dtypes, with those dtypes' tolerances "
                             "(default: float64 everywhere, so rounding cannot pass for a wrong plan)")
    parser.add_argument("--json", action="store_true", help="print the verdict as JSON")
    parser.set_defaults(run=run)


def add_program_args(parser: argparse.ArgumentParser) -> None:
    """Flags choosing the partitioned program: the prices that pick each resharding's collectives
    (see `resharding_price`) and whether the collective optimisations run, as in `plan`."""
    parser.add_argument("--topology", help="price reshardings with this profile, as `plan` did "
                                           "(default: the plan's topology if it names one, else bytes moved)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--nodes", type=integer_flag, help="number of GPU nodes (GPU profiles)")
    group.add_argument("--slice", help="TPU slice shape, e.g. 4x4x4")
    parser.add_argument("--no-collective-opt", action="store_true",
                        help="the collectives as planned, without the optimisations `plan` applies by default")


def plan_mesh(document: object, given: str | None) -> Mesh:
    """The mesh to simulate on: `--mesh` if given (it must match the plan's), else the plan's."""
    if given is None:
        stated = stated_mesh(document)
        if stated is None:
            raise InputError('the plan states no mesh: expected {"axes": [{"name": "dp", "size": 2}, ...]}', "/mesh")
        return stated
    mesh = Mesh.parse(given)
    check_plan_mesh(document, mesh, "--mesh")
    return mesh


def resharding_price(args: argparse.Namespace, document: object, mesh: Mesh) -> Price:
    """The prices that pick each resharding's collectives: those of `--topology`, else of the
    topology the plan names, placed as the plan's `topology_options` say unless `--nodes` or
    `--slice` are given (if it binds to the mesh), else bytes moved. Every choice is exact, so
    only which collectives run depends on this, not the verdict's meaning."""
    if args.topology:
        return hardware_from_args(args, mesh).collective_seconds
    if args.nodes is not None and args.nodes < 1:
        raise InputError("must be a positive integer", "--nodes")
    named = document.get("topology") if isinstance(document, dict) else None
    if isinstance(named, str):
        placed = document.get("topology_options") if isinstance(document.get("topology_options"), dict) else {}
        nodes = args.nodes if args.nodes is not None or args.slice else placed.get("nodes")
        slice_shape = parse_slice(args.slice) if args.slice or args.nodes is not None else placed.get("slice")
        mapping = None if args.slice or args.nodes is not None else placed.get("mapping")
        try:
            return bind_hardware(named, mesh, nodes=nodes, slice_shape=slice_shape, mapping=mapping).collective_seconds
        except InputError as error:
            print(f"note: the plan's topology {named!r} does not bind to mesh {mesh} ({error.problems[0]}); "
                  f"pricing reshardings by bytes moved", file=sys.stderr)
    return bytes_moved_price(mesh)


def run(args: argparse.Namespace) -> int:
    if args.seed < 0:
        raise InputError(f"must be >= 0, got {args.seed}", "--seed")
    document = read_json(args.plan)
    mesh = plan_mesh(document, args.mesh)
    microbatching = microbatch(graph_of_plan(args.graph, document, mesh), stated_microbatches(document))
    plan = read_plan(document, microbatching.graph, mesh)
    limit = parse_bytes(args.max_memory, "--max-memory")
    pipelined = None
    try:
        program, _ = partitioned_program(plan, resharding_price(args, document, mesh), not args.no_collective_opt)
        if "pipeline" in document:  # as the step runs: each stage's items in the schedule's order
            staged = stage_program(program, read_cut(document, microbatching.graph))
            run = simulate_pipelined(staged, microbatching, seed=args.seed, max_bytes=limit,
                                     widen=not args.declared_dtypes)
            verdict, pipelined = run.verdict, run.to_json()
        elif microbatching.count > 1:  # as the step runs: forward and backward per microbatch
            verdict = simulate_microbatched(program, microbatching, seed=args.seed, max_bytes=limit,
                                            widen=not args.declared_dtypes)
        else:
            verdict = simulate_program(program, seed=args.seed, max_bytes=limit, widen=not args.declared_dtypes)
    except InputError as error:
        # The library names its parameter; the user set the flag.
        raise InputError([Problem("--max-memory" if p.where == "max_bytes" else p.where, p.message)
                          for p in error.problems]) from None
    if args.json:
        print(json.dumps({**verdict.to_json(), **({"pipeline": pipelined} if pipelined else {})}, indent=1))
    else:
        print(f"{verdict.summary()} (seed {args.seed})")
        if pipelined:
            print(f"pipelined: in-flight peaks per stage {pipelined['inflight_peaks']}, "
                  f"{pipelined['transfers']} transfers between stages")
    return 0 if verdict.passed else 1
