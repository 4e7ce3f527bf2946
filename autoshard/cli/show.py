"""`autoshard show GRAPH.json`: a table of ops with their layer, phase, loops, FLOPs and bytes."""

from __future__ import annotations

import argparse

from autoshard.cli.args import integer_flag
from autoshard.graph.model import topological_order
from autoshard.graph.schema import load_graph
from autoshard.graph.summary import graph_summary, si, size
from autoshard.ops import INVALID, REDUCTION
from autoshard.ops.nn import COMBINED

_ITERATOR_MARK = {REDUCTION: "r", INVALID: "x", COMBINED: "c"}


def loops_text(extents: tuple[int, ...], iterators: tuple[str, ...]) -> str:
    """`64p 1024r`: extent then p(arallel) / r(eduction) / x (invalid: never split)."""
    return " ".join(f"{e}{_ITERATOR_MARK.get(t, 'p')}" for e, t in zip(extents, iterators))


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("show", help="print the ops of a graph: kind, layer, phase, loops, FLOPs, bytes")
    parser.add_argument("graph", help="graph JSON (format autoshard.graph/v1)")
    parser.add_argument("--limit", type=integer_flag, default=0, help="print at most this many ops (0: all)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    graph = load_graph(args.graph)
    print(graph_summary(graph))
    phases = graph.phases
    rows = [("op", "kind", "layer", "phase", "loops (p parallel, r reduction, c combined by the op, x invalid)", "FLOP", "bytes in+out")]
    ops = topological_order(graph)
    for op in ops[: args.limit or None]:
        moved = sum(graph.tensors[t].bytes for t in op.operands)
        rows.append((op.name, op.kind, "-" if op.layer is None else str(op.layer), phases[op.name],
                     loops_text(op.nest.extents, op.nest.iterator_types), si(op.flops()), size(moved)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    if args.limit and len(ops) > args.limit:
        print(f"... {len(ops) - args.limit} more ops")
    return 0
