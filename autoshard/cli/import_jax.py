"""`autoshard import jax FILE.py:FACTORY -o GRAPH.json [--strict]`: a JAX function's graph document."""

from __future__ import annotations

import argparse
from pathlib import Path

from autoshard.errors import InputError
from autoshard.graph.builder import document_text
from autoshard.graph.schema import graph_from_json
from autoshard.graph.summary import graph_summary


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("import", help="import a framework's program as a graph document")
    frameworks = parser.add_subparsers(dest="framework", metavar="FRAMEWORK", required=True)
    jax = frameworks.add_parser("jax", help="a JAX function, traced to its jaxpr",
                                description="FACTORY() takes no arguments and returns (f, args), args a tuple.")
    jax.add_argument("factory", metavar="FILE.py:FACTORY")
    jax.add_argument("-o", "--output", required=True, help="graph JSON file to write")
    jax.add_argument("--strict", action="store_true", help="refuse primitives the graph cannot express "
                                                           "(default: opaque ops, kept whole, with a warning)")
    jax.set_defaults(run=run_jax)


def run_jax(args: argparse.Namespace) -> int:
    from autoshard.frontends.jax import import_factory  # jax is imported only when asked for

    document = import_factory(args.factory, strict=args.strict)
    graph = graph_from_json(document)
    try:
        Path(args.output).write_text(document_text(document))
    except OSError as error:
        raise InputError(f"cannot write file: {error.strerror}", "--output") from None
    print(f"wrote {args.output}: {graph_summary(graph)}")
    return 0
