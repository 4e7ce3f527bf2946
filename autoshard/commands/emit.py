"""`autoshard emit GRAPH.json --plan PLAN.json --stage annotated|partitioned [--dialect mesh|shard]`:
the MLIR of a given plan (one `autoshard plan` wrote, or one edited by hand)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from autoshard.commands.simulate import add_pricing_args, plan_mesh, resharding_price
from autoshard.errors import InputError
from autoshard.mlir import ARGUMENT_CONVENTIONS, DIALECTS, emit_annotated, emit_partitioned
from autoshard.plan import plan_from_json
from autoshard.schema import load_graph, read_json
from autoshard.spmd import partition

STAGES = ("annotated", "partitioned")


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("emit", help="MLIR of a given plan: annotated or partitioned")
    parser.add_argument("graph", help="graph JSON (format autoshard.graph/v1)")
    parser.add_argument("--plan", required=True, help="plan JSON (format autoshard.plan/v1, or its minimal form)")
    parser.add_argument("--mesh", help="mesh axes, e.g. dp=2,tp=4 (default: the plan's mesh)")
    parser.add_argument("--stage", default="annotated", help="annotated (default) or partitioned")
    parser.add_argument("--dialect", default="mesh", help="mesh (default) or shard (upstream LLVM 22)")
    parser.add_argument("--arguments", default="local",
                        help="partitioned IR's function arguments: local shards (default) or global values")
    add_pricing_args(parser)
    parser.add_argument("-o", "--output", help="file to write (default: standard output)")
    parser.set_defaults(run=run)


def _choice(value: str, choices: tuple[str, ...] | list[str], flag: str) -> str:
    if value not in choices:
        raise InputError(f"expected {' or '.join(choices)}, got {value!r}", flag)
    return value


def run(args: argparse.Namespace) -> int:
    stage = _choice(args.stage, STAGES, "--stage")
    dialect = _choice(args.dialect, list(DIALECTS), "--dialect")
    arguments = _choice(args.arguments, ARGUMENT_CONVENTIONS, "--arguments")
    document = read_json(args.plan)
    mesh = plan_mesh(document, args.mesh)
    plan = plan_from_json(document, load_graph(args.graph, mesh), mesh)
    if stage == "annotated":
        text = emit_annotated(plan, dialect=dialect)
    else:
        text = emit_partitioned(partition(plan, resharding_price(args, document, mesh)), dialect=dialect,
                                arguments=arguments)
    if args.output:
        Path(args.output).write_text(text)
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
