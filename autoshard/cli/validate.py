"""`autoshard validate GRAPH.json [--mesh ...]`: check a graph, print a one-line summary."""

from __future__ import annotations

import argparse

from autoshard.cli.args import mesh_from_args
from autoshard.graph.schema import load_graph
from autoshard.graph.summary import graph_summary


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("validate", help="check a graph document; exit 2 with every problem found")
    parser.add_argument("graph", help="graph JSON (format autoshard.graph/v1)")
    parser.add_argument("--mesh", help="mesh to check constraints against, e.g. dp=2,tp=4")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    mesh = mesh_from_args(args) if args.mesh is not None else None  # an empty --mesh is a bad mesh, as in plan
    graph = load_graph(args.graph, mesh)
    print(f"ok: {graph_summary(graph)}")
    return 0
