"""Arguments several commands share: mesh, topology, sizes; parsed into library types."""

from __future__ import annotations

import argparse
import math
import re
from pathlib import Path
from typing import Any, Callable

from autoshard.errors import InputError, Problem
from autoshard.graph.builder import document_text
from autoshard.graph.model import Graph
from autoshard.graph.recompute import stated_recompute, with_recomputation
from autoshard.graph.schema import load_graph
from autoshard.graph.summary import graph_summary
from autoshard.mesh import Mesh
from autoshard.numerals import non_ascii_problem, parse_dims, parse_finite, parse_integer, parse_real
from autoshard.planning.hardware import bind_hardware

_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "t": 1e12, "tb": 1e12,
          "kib": 2 ** 10, "mib": 2 ** 20, "gib": 2 ** 30, "tib": 2 ** 40}


def parse_bytes(text: str, flag: str) -> float:
    """`40GiB`, `80GB`, `1.5e9` -> bytes (GB decimal, GiB binary); a finite number."""
    if (odd := non_ascii_problem(text)) is not None:
        raise InputError(odd, flag)
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise InputError(f"expected a size like 40GiB, 80GB or 1.5e9, got {text!r}", flag)
    size = parse_finite(match.group(1), flag) * _UNITS[match.group(2).lower()]
    if not math.isfinite(size):
        raise InputError(f"{text!r} is beyond the range of a floating-point number", flag)
    return size


def parse_slice(text: str | None) -> tuple[int, ...] | None:
    return None if text is None else parse_dims(text, "--slice", "expected a slice shape like 4x4x4")


def integer_flag(text: str) -> int:
    """argparse `type` of every whole-number flag: ASCII digits only (argparse names the flag)."""
    return _flag_value(parse_integer, text)


def number_flag(text: str) -> float:
    """argparse `type` of every real-number flag: in ASCII (argparse names the flag); `nan` and `inf`
    are left to the command's range checks, which report every flag's problem at once."""
    return _flag_value(parse_real, text)


def _flag_value(parse: Callable[[str, str], Any], text: str) -> Any:
    try:
        return parse(text, "")
    except InputError as error:
        raise argparse.ArgumentTypeError(error.problems[0].message) from None


def add_hardware_args(parser: argparse.ArgumentParser, mesh_required: bool = True) -> None:
    parser.add_argument("--mesh", required=mesh_required, help="mesh axes, e.g. dp=2,tp=4")
    parser.add_argument("--topology", default="dgx-h100", help="profile name (see `autoshard topologies`) or a profile JSON file")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--nodes", type=integer_flag, help="number of GPU nodes (GPU profiles)")
    group.add_argument("--slice", help="TPU slice shape, e.g. 4x4x4")


_FLAGS = {"topology": "--topology", "mesh": "--mesh", "nodes": "--nodes", "slice_shape": "--slice",
          "mapping": "--mapping"}


def flag_of(field: str) -> str:
    """The command-line flag a hardware binding field comes from (`mapping.dp` -> `--mapping dp`;
    a field of the profile itself -> `--topology FIELD`); a flag is itself."""
    if field.startswith("-"):
        return field
    head, _, rest = field.removeprefix("topology/").partition(".")
    flag = _FLAGS.get(head)
    return f"{flag} {rest}".rstrip() if flag else f"--topology {field.removeprefix('topology/')}"


def hardware_from_args(args: argparse.Namespace, mesh: Mesh):
    if args.nodes is not None and args.nodes < 1:
        raise InputError("must be a positive integer", "--nodes")
    try:
        return bind_hardware(args.topology, mesh, nodes=args.nodes, slice_shape=parse_slice(args.slice))
    except InputError as error:
        raise InputError([Problem(flag_of(p.where), p.message) for p in error.problems]) from None


def mesh_from_args(args: argparse.Namespace) -> Mesh:
    """`--mesh`; a problem with one axis is named `--mesh AXIS`."""
    try:
        return Mesh.parse(args.mesh)
    except InputError as error:
        raise InputError([Problem("--mesh" + p.where.removeprefix("mesh").replace("/", " ", 1), p.message)
                          for p in error.problems]) from None


def write_graph(document: dict[str, Any], graph: Graph, output: str) -> None:
    """Write a graph document to `output` (`-o`) and say what it holds."""
    try:
        Path(output).write_text(document_text(document))
    except OSError as error:
        raise InputError(f"cannot write file: {error.strerror}", "--output") from None
    print(f"wrote {output}: {graph_summary(graph)}")


def graph_of_plan(path: str, document: Any, mesh: Mesh) -> Graph:
    """The graph at `path` as the plan `document` was made for it: with the recomputation the
    plan states (`plan --recompute`)."""
    graph = load_graph(path, mesh)
    try:
        return with_recomputation(graph, stated_recompute(document), mesh)
    except InputError as error:  # the plan's field, which the rewrite could not apply to this graph
        raise InputError([Problem("/recompute", p.message) for p in error.problems]) from None
