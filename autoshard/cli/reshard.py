"""`autoshard reshard --mesh x=2,y=3 --shape 6x6 --from SHARDING --to SHARDING [--verify]`: plan one resharding.

Prints the planned collectives, their cost, and the partitioned IR of a function taking each
device's source shard and returning its target shard. Prices come from `--topology` when given,
else from bytes moved (`autoshard.resharding.bytes_moved_price`), and the output says which.
`--verify` runs the steps in the simulator on a random tensor and exits 1 unless every device
ends (and every step leaves it) holding exactly its shard.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any, Callable, TypeVar

import numpy as np

from autoshard.cli.args import hardware_from_args, integer_flag, mesh_from_args
from autoshard.dtypes import DTYPES
from autoshard.errors import InputError, Problem, ShardingError
from autoshard.graph.summary import size
from autoshard.mesh import Mesh
from autoshard.numerals import parse_dims
from autoshard.mlir import DIALECTS, emit_partitioned
from autoshard.resharding import CollectiveStep, Price, Resharding, bytes_moved_price, plan_resharding
from autoshard.sharding import Sharding
from autoshard.sim.reshard_check import verify_resharding
from autoshard.sim.verdict import Verdict
from autoshard.spmd.program import resharding_program

VERIFY_MAX_BYTES = 2 * 2 ** 30  # host memory a --verify run may hold: the tensor and two layouts of it
T = TypeVar("T")
SHARDING_FORM = ('{"split_axes": [["x"], ["y"]], "partial": {"kind": "sum", "axes": ["x"]}, "halo_sizes": [1, 1, 0, 0]} '
                 '(partial and halo_sizes optional) or the short form [[x],[y]]')


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("reshard", help="plan the collectives that turn one sharding of a tensor into another")
    parser.add_argument("--mesh", required=True, help="mesh axes, e.g. x=2,y=3")
    parser.add_argument("--shape", required=True, help="global tensor shape, e.g. 6x6")
    parser.add_argument("--dtype", default="f32", help=f"element type, one of {', '.join(DTYPES)} (default f32)")
    parser.add_argument("--from", dest="source", required=True, metavar="SHARDING",
                        help=f"the source sharding: {SHARDING_FORM}")
    parser.add_argument("--to", dest="target", required=True, metavar="SHARDING", help="the target sharding")
    parser.add_argument("--topology", help="price with this profile (see `autoshard topologies`) or profile JSON file "
                                           "(default: bytes moved over a flat link)")
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--nodes", type=integer_flag, help="number of GPU nodes (GPU profiles)")
    group.add_argument("--slice", help="TPU slice shape, e.g. 4x4x4")
    parser.add_argument("--dialect", choices=sorted(DIALECTS), default="mesh",
                        help="spelling of the partitioned IR (default mesh)")
    parser.add_argument("--json", action="store_true", help="print steps, cost and IR as JSON")
    parser.add_argument("--verify", action="store_true",
                        help="run the steps in the simulator and check every device's shard; exit 1 on FAIL")
    parser.set_defaults(run=run)


def parse_shape(text: str) -> tuple[int, ...]:
    return parse_dims(text, "--shape", "expected positive sizes joined by x, e.g. 6x6 or 1024")


def parse_sharding(text: str, flag: str, mesh: Mesh, shape: tuple[int, ...]) -> Sharding:
    """`--from`/`--to`: a sharding that fits the mesh and the tensor's rank; errors name the flag."""
    try:
        sharding = Sharding.parse(text, rank=len(shape))
        sharding.check(mesh, shape, flag)
    except ShardingError as error:
        raise InputError([Problem(flag if p.where in ("", flag) else f"{flag} {p.where}", p.message)
                          for p in error.problems]) from None
    return sharding


def parse_dtype(text: str) -> str:
    if text not in DTYPES:
        raise InputError(f"unknown element type {text!r}; expected one of {list(DTYPES)}", "--dtype")
    return text


def parse_inputs(args: argparse.Namespace) -> tuple[Mesh, tuple[int, ...], Sharding, Sharding]:
    """Mesh, shape and both shardings; every problem found in them is reported at once."""
    problems: list[Problem] = []

    def attempt(parse: Callable[..., T], *values: Any) -> T | None:
        try:
            return parse(*values)
        except InputError as error:
            problems.extend(error.problems)
            return None

    mesh, shape = attempt(mesh_from_args, args), attempt(parse_shape, args.shape)
    attempt(parse_dtype, args.dtype)
    if mesh is None or shape is None:
        raise InputError(problems)
    source = attempt(parse_sharding, args.source, "--from", mesh, shape)
    target = attempt(parse_sharding, args.target, "--to", mesh, shape)
    if problems:
        raise InputError(problems)
    return mesh, shape, source, target


def choose_price(args: argparse.Namespace, mesh: Mesh) -> tuple[Price, dict[str, Any]]:
    """The price of each collective and how it was chosen (for the output)."""
    if args.topology is None:
        for flag, value in (("--nodes", args.nodes), ("--slice", args.slice)):
            if value is not None:
                raise InputError("only applies with --topology", flag)
        price = bytes_moved_price(mesh)
        return price, {"model": "bytes_moved", "bytes_per_s": price.bytes_per_s_oneway}
    topo = hardware_from_args(args, mesh)
    return topo.collective_seconds, {"model": "topology", "topology": topo.profile.name,
                                     "machine": topo.machine.describe()}


def plan(mesh: Mesh, shape: tuple[int, ...], dtype: str, source: Sharding, target: Sharding,
         price: Price) -> Resharding:
    try:
        return plan_resharding(mesh, shape, DTYPES[dtype].itemsize, source, target, price)
    except ShardingError as error:  # a sum-partial target the source cannot reach
        raise InputError([Problem("--to" if p.where.startswith("target") else "--from", p.message)
                          for p in error.problems]) from None


def simulated_bytes(mesh: Mesh, resharding: Resharding, dtype: str) -> int:
    """Host memory `--verify` needs: the tensor and, at a step, the layouts before and after it."""
    itemsize = np.dtype(DTYPES[dtype].numpy).itemsize
    layouts = [resharding.source, *(step.after for step in resharding.steps)]
    largest = max(math.prod(s.max_local_shape(mesh, resharding.shape)) for s in layouts) * mesh.num_devices
    return itemsize * (math.prod(resharding.shape) + 2 * largest)


def verify(mesh: Mesh, resharding: Resharding, dtype: str) -> Verdict:
    needed = simulated_bytes(mesh, resharding, dtype)
    if needed > VERIFY_MAX_BYTES:
        raise InputError(f"simulating this resharding holds about {size(needed)} in host memory, over the "
                         f"{size(VERIFY_MAX_BYTES)} limit; verify with a smaller --shape", "--verify")
    return verify_resharding(mesh, resharding, dtype, seed=0)


def describe_step(step: CollectiveStep) -> str:
    if step.kind == "permute":
        detail = f"{len(step.pairs)} point-to-point transfers"
    else:
        detail = ", ".join(f"{k}={list(v) if isinstance(v, tuple) else v}" for k, v in step.dims.items())
    return (f"{step.kind} over [{', '.join(step.mesh_axes)}] ({detail}): {step.before} -> {step.after}; "
            f"{size(step.bytes_per_device)} per device, {step.seconds * 1e6:.4g} us")


def describe_price(pricing: dict[str, Any]) -> str:
    if pricing["model"] == "bytes_moved":
        return (f"priced by bytes moved (autoshard.resharding.bytes_moved_price: what each device receives, "
                f"over a flat {pricing['bytes_per_s'] / 1e9:g} GB/s link), as no --topology was given")
    return f"priced on {pricing['topology']}, {pricing['machine']}"


def verdict_line(verdict: Verdict, steps: int) -> str:
    if verdict.passed:
        return f"verify: PASS, every device holds exactly its shard after each of the {steps} step(s)"
    return f"verify: {verdict.summary()}"


def run(args: argparse.Namespace) -> int:
    mesh, shape, source, target = parse_inputs(args)
    price, pricing = choose_price(args, mesh)
    resharding = plan(mesh, shape, args.dtype, source, target, price)
    # Verify first: a simulation over its memory limit is refused before the IR is written out.
    verdict = verify(mesh, resharding, args.dtype) if args.verify else None
    ir = emit_partitioned(resharding_program(mesh, resharding, args.dtype, price), args.dialect)
    target_shard_bytes = math.prod(target.max_local_shape(mesh, shape)) * DTYPES[args.dtype].itemsize

    if args.json:
        document = {"mesh": str(mesh), "shape": list(shape), "dtype": args.dtype, "source": source.to_json(),
                    "target": target.to_json(), "price": pricing, "steps": [s.to_json() for s in resharding.steps],
                    "seconds": resharding.seconds,
                    "max_bytes_received_per_device": resharding.max_bytes_received_per_device,
                    "target_shard_bytes": target_shard_bytes, "dialect": args.dialect, "ir": ir}
        if verdict is not None:
            document["verify"] = verdict.to_json()
        print(json.dumps(document, indent=1))
    else:
        print(f"reshard {'x'.join(map(str, shape))} {args.dtype} on mesh {mesh}: {source} -> {target}")
        print(describe_price(pricing))
        print(f"steps ({len(resharding.steps)}):" if resharding.steps else "steps: none (the layouts are the same)")
        for number, step in enumerate(resharding.steps, start=1):
            print(f"  {number}. {describe_step(step)}")
        print(f"total: {resharding.seconds * 1e6:.4g} us; at most {size(resharding.max_bytes_received_per_device)} "
              f"received per device (the target shard is {size(target_shard_bytes)})")
        if verdict is not None:
            print(verdict_line(verdict, len(resharding.steps)))
        print(f"partitioned IR ({args.dialect} dialect):")
        print(ir, end="")
    return 0 if verdict is None or verdict.passed else 1
