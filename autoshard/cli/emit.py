"""`autoshard emit GRAPH.json --plan PLAN.json --stage annotated|partitioned [--dialect mesh|shard]`:
the MLIR of a given plan (one `autoshard plan` wrote, or one edited by hand); a pipelined plan's
partitioned IR has one function per virtual stage."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from autoshard.cli.args import graph_of_plan, hardware_from_args, parse_slice
from autoshard.cli.simulate import add_program_args, plan_mesh, resharding_price
from autoshard.delivery.deliver import STAGES, ir_request_problems, partitioned_ir, partitioned_program
from autoshard.errors import InputError
from autoshard.graph.schema import read_json
from autoshard.mesh import Mesh
from autoshard.mlir import emit_annotated
from autoshard.planning.microbatches import microbatch, stated_microbatches
from autoshard.planning.pipeline_cut import read_cut
from autoshard.planning.plan_contract import read_plan


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("emit", help="MLIR of a given plan: annotated or partitioned")
    parser.add_argument("graph", help="graph JSON (format autoshard.graph/v1)")
    parser.add_argument("--plan", required=True, help="plan JSON (format autoshard.plan/v1, as `plan` writes it)")
    parser.add_argument("--mesh", help="mesh axes, e.g. dp=2,tp=4 (default: the plan's mesh)")
    parser.add_argument("--stage", default="annotated", help=f"{' or '.join(STAGES)} (default annotated)")
    parser.add_argument("--dialect", default="mesh", help="mesh (default) or shard (upstream LLVM 22)")
    parser.add_argument("--arguments", default="local",
                        help="partitioned IR's function arguments: local shards (default) or global values")
    add_program_args(parser)
    parser.add_argument("-o", "--output", help="file to write (default: standard output)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    problems = ir_request_problems([args.stage], args.dialect, args.arguments,
                                   {"emit": "--stage", "dialect": "--dialect", "arguments": "--arguments"})
    if problems:
        raise InputError(problems)
    document = read_json(args.plan)
    mesh = plan_mesh(document, args.mesh)
    _check_hardware_flags(args, mesh)
    # a plan made for microbatches is the step on one microbatch
    microbatching = microbatch(graph_of_plan(args.graph, document, mesh), stated_microbatches(document))
    plan = read_plan(document, microbatching.graph, mesh)
    if args.stage == "annotated":
        text = emit_annotated(plan, dialect=args.dialect)
    else:
        program, _ = partitioned_program(plan, resharding_price(args, document, mesh), not args.no_collective_opt)
        cut = read_cut(document, microbatching.graph) if "pipeline" in document else None
        text = partitioned_ir(program, args.dialect, args.arguments, cut)
    if args.output:
        try:
            Path(args.output).write_text(text)
        except OSError as error:
            raise InputError(f"cannot write {args.output!r}: {error.strerror}", "-o") from None
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _check_hardware_flags(args: argparse.Namespace, mesh: Mesh) -> None:
    """Name a wrong `--topology`, `--nodes` or `--slice` at every stage, though only the
    partitioned one prices reshardings with them."""
    if args.topology:
        hardware_from_args(args, mesh)
    elif args.nodes is not None and args.nodes < 1:
        raise InputError("must be a positive integer", "--nodes")
    else:
        parse_slice(args.slice)
