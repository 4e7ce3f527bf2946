"""`autoshard estimate GRAPH.json --mesh ... --topology ... --plan PLAN.json [--json]`: price a given plan."""

from __future__ import annotations

import argparse
import json

from autoshard.cli.args import add_hardware_args, graph_of_plan, hardware_from_args, integer_flag, mesh_from_args
from autoshard.cli._pipeline_flags import print_pipeline
from autoshard.cli.plan import print_roles
from autoshard.cli.simulate import plan_mesh
from autoshard.errors import InputError, Problem
from autoshard.graph.schema import read_json
from autoshard.graph.summary import si, size
from autoshard.planning.microbatches import microbatch, stated_microbatches
from autoshard.planning.pipeline_cut import read_cut
from autoshard.planning.pipeline_plan import estimate_cut, pipeline_mesh
from autoshard.planning.plan_contract import read_plan
from autoshard.planning.report import estimate
from autoshard.planning.roles import roles_document


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("estimate", help="compute, communication and memory of a given plan")
    parser.add_argument("graph", help="graph JSON (format autoshard.graph/v1)")
    add_hardware_args(parser)
    parser.add_argument("--plan", required=True,
                        help="plan JSON (format autoshard.plan/v1, as `plan` writes it)")
    parser.add_argument("--microbatches", type=integer_flag,
                        help="price the step as M microbatches (default: as many as the plan was made for, or 1)")
    parser.add_argument("--json", action="store_true", help="print the breakdown as JSON")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    mesh = mesh_from_args(args)
    document = read_json(args.plan)
    plan_mesh(document, args.mesh)  # a plan made for another mesh is refused, as `emit` and `simulate` do
    graph = graph_of_plan(args.graph, document, mesh)
    try:
        microbatching = microbatch(graph, stated_microbatches(document, args.microbatches))
    except InputError as error:  # the library names its parameter; the user set the flag
        raise InputError([Problem("--microbatches" if p.where == "microbatches" else p.where, p.message)
                          for p in error.problems]) from None
    plan = read_plan(document, microbatching.graph, mesh)
    cut = read_cut(document, microbatching.graph) if "pipeline" in document else None
    # a pipelined plan's machine is its stages times the stage's mesh, `pp` outermost, as `plan` bound it
    hw = hardware_from_args(args, mesh if cut is None else pipeline_mesh(mesh, cut.orders.stages))
    microbatched = microbatching if microbatching.count > 1 else None
    report = estimate(plan, hw, microbatched)
    roles = roles_document(plan)
    pipelined = estimate_cut(plan, report, microbatched, mesh, hw, cut) if cut is not None else None
    if args.json:
        print(json.dumps({**report.to_json(), "roles": roles,
                          **({"pipeline": pipelined.to_json()} if pipelined else {})}, indent=1))
        return 0
    rows = [("op", "kind", "option", "compute", "bound", "communication")]
    for entry in report.ops:
        option = "[" + ", ".join("[" + ",".join(a) + "]" for a in entry["option"]) + "]"
        option += f" ring {entry['ring']}" if "ring" in entry else ""
        rows.append((entry["op"], entry["kind"], option, f"{entry['compute_s'] * 1e6:.4g} us", entry["bound"],
                     f"{entry['communication_s'] * 1e6:.4g} us"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    print(f"total: step {report.step_s * 1e3:.4g} ms = compute {report.compute_s * 1e3:.4g} ms + communication "
          f"{report.communication_s * 1e3:.4g} ms ({si(report.communication_bytes, 'B')} per device)")
    overlap = report.overlap
    print(f"overlapped: step {overlap.step_s * 1e3:.4g} ms = max(compute, hideable {overlap.hideable_s * 1e3:.4g} ms) "
          f"+ exposed; communication hidden {overlap.hidden_s * 1e3:.4g} ms, exposed {overlap.exposed_s * 1e3:.4g} ms")
    for axis in sorted(report.bytes_per_axis):
        hidden, exposed = overlap.hidden_s_per_axis[axis], overlap.exposed_s_per_axis[axis]
        print(f"  axis {axis}: {report.seconds_per_axis[axis] * 1e3:.4g} ms, {si(report.bytes_per_axis[axis], 'B')} "
              f"(hidden {hidden * 1e3:.4g} ms, exposed {exposed * 1e3:.4g} ms)")
    print(f"peak memory {size(report.peak_memory_bytes)} per device at op {report.peak_op!r} "
          f"(parameters {size(report.parameter_bytes)}, activations {size(report.activation_peak_bytes)})")
    print_roles(roles, indent="")
    if pipelined is not None:
        print("the whole step above is on one stage's mesh; its stages in the schedule (memory against the chip's HBM):")
        print_pipeline(pipelined.to_json(), indent="")
    return 0
