"""`autoshard collective KIND --topology NAME --mesh x=4,y=4 --axes x,y --bytes B [--json]`: price one collective.

Binds the mesh to the topology, then prints the time of KIND within each group of
the named mesh axes, with its algorithm and bus bandwidth (nccl-tests conventions). `--bytes` is
each device's input buffer; for all_gather and gather, its shard.
"""

from __future__ import annotations

import argparse
import json
import math

import cost_models
from autoshard.cli.args import add_hardware_args, flag_of, mesh_from_args, parse_bytes, parse_slice
from autoshard.errors import InputError, Problem
from autoshard.graph.summary import si
from autoshard.mesh import Mesh


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("collective", help="time of one collective over mesh axes on a topology")
    parser.add_argument("kind", choices=cost_models.COLLECTIVE_KINDS, metavar="KIND",
                        help=f"one of {', '.join(cost_models.COLLECTIVE_KINDS)}")
    add_hardware_args(parser)
    parser.add_argument("--axes", help="mesh axes of the group, e.g. x,y (default: every axis)")
    parser.add_argument("--bytes", required=True, help="each device's input buffer (all_gather: its shard), e.g. 64MiB")
    parser.add_argument("--mapping", help="physical dims of each mesh axis, e.g. dp=node,tp=gpu or a=x,b=y+z "
                                          "(default: inner mesh axes on the fastest links)")
    parser.add_argument("--no-nvls", action="store_true", help="price GPU all-reduce without NVLink SHARP "
                                                               "(as NCCL_NVLS_ENABLE=0)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.set_defaults(run=run)


def parse_axes(text: str | None, mesh: Mesh) -> tuple[str, ...]:
    if text is None:
        return mesh.axis_names
    axes = tuple(a.strip() for a in text.split(","))
    unknown = [a for a in axes if a not in mesh.axis_names]
    if unknown or len(set(axes)) != len(axes):  # an empty name too: a group of one device has no collective
        raise InputError(f"expected distinct mesh axes from {list(mesh.axis_names)}, got {text!r}", "--axes")
    return axes


def parse_mapping(text: str | None) -> dict[str, list[str]] | None:
    if text is None:
        return None
    mapping = {}
    for part in text.split(","):
        axis, sep, dims = part.partition("=")
        if not sep or not axis.strip() or not dims.strip():
            raise InputError(f"expected AXIS=DIM[+DIM...][,...], e.g. dp=node,tp=gpu; got {text!r}", "--mapping")
        if axis.strip() in mapping:
            raise InputError(f"mesh axis {axis.strip()!r} is mapped twice; give each axis once", "--mapping")
        mapping[axis.strip()] = [d.strip() for d in dims.split("+")]
    return mapping


def bind_topology(args: argparse.Namespace, mesh: Mesh) -> cost_models.BoundTopology:
    try:
        profile = cost_models.load_profile(args.topology)
        if args.no_nvls:
            if not isinstance(profile, cost_models.GpuProfile):
                raise InputError(f"{profile.name} is not a GPU profile; NVLS is an NVSwitch feature", "--no-nvls")
            profile = profile.without_nvls()
        return cost_models.bind(profile, mesh.axis_names, mesh.shape, nodes=args.nodes,
                                slice_shape=parse_slice(args.slice), mapping=parse_mapping(args.mapping))
    except cost_models.TopologyError as error:
        raise InputError([Problem(flag_of(field), message) for field, message in error.problems]) from None


def finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def run(args: argparse.Namespace) -> int:
    mesh = mesh_from_args(args)
    axes = parse_axes(args.axes, mesh)
    size = parse_bytes(args.bytes, "--bytes")
    topo = bind_topology(args, mesh)
    seconds = topo.collective_seconds(args.kind, axes, size)
    algbw = topo.algbw_bytes_per_s(args.kind, axes, size)
    busbw = topo.busbw_bytes_per_s(args.kind, axes, size)
    group = topo.group_size(axes)
    if args.json:
        print(json.dumps({
            "kind": args.kind, "topology": topo.profile.name, "machine": topo.machine.describe(), "mesh": str(mesh),
            "axes": list(axes), "group_size": group, "link_class": topo.group_link_class(axes),
            "placement": {axis: topo.describe_axis(axis) for axis in mesh.axis_names},
            "bytes_per_device": size, "seconds": seconds, "algbw_bytes_per_s": finite(algbw),
            "busbw_bytes_per_s": finite(busbw)}, indent=1))
        return 0
    print(f"{args.kind} over {','.join(axes) or '(no axes)'} ({group} devices per group) on {topo.profile.name}, "
          f"{topo.machine.describe()}")
    for axis in mesh.axis_names:
        print(f"  {topo.describe_axis(axis)}")
    print(f"bytes per device: {si(size, 'B')}")
    print(f"time:  {seconds * 1e6:.4g} us")
    print(f"algbw: {si(algbw, 'B/s') if math.isfinite(algbw) else 'n/a'}")
    print(f"busbw: {si(busbw, 'B/s') if math.isfinite(busbw) else 'n/a'}")
    return 0
