"""Bytes per parameter a generated training step holds on one device, and how microbatches
change its peak: the state (weights, Adam's moments), the peak and what is live there.

    python benchmarks/training_state.py --layers 2 --hidden 256
    python benchmarks/training_state.py --layers 2 --hidden 256 --microbatches 1 2 4 8

Every value is replicated on a one-device mesh, so the numbers are the model's own, not a
plan's. "per weight" divides by the weights' element count (Adam's moments are not counted as
parameters there, as published bytes-per-parameter figures count them).
"""

from __future__ import annotations

import argparse

from autoshard.graph.schema import graph_from_json
from autoshard.graph.summary import size
from autoshard.mesh import Mesh
from autoshard.models import GPTConfig, gpt
from autoshard.planning.hardware import bind_hardware
from autoshard.planning.microbatches import microbatch
from autoshard.planning.options import ShardingOption
from autoshard.planning.plan import Plan
from autoshard.planning.report import estimate
from autoshard.sharding import Sharding


def replicated(graph, mesh: Mesh) -> Plan:
    options = {op.name: ShardingOption.replicated(len(op.nest.extents)) for op in graph.ops}
    storage = {t.name: Sharding() for t in graph.tensors.values() if t.role != "intermediate"}
    return Plan(graph, mesh, options, storage)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--microbatches", type=int, nargs="*", default=[],
                        help="also price the step as each of these numbers of microbatches")
    args = parser.parse_args()
    config = GPTConfig(layers=args.layers, hidden=args.hidden, heads=args.heads, seq=args.seq, batch=args.batch,
                       vocab=args.vocab, dtype="bf16")
    graph = graph_from_json(gpt(config, training=True))
    mesh = Mesh.parse("x=1")
    hw = bind_hardware("dgx-h100", mesh)
    weights = sum(t.bytes // t.itemsize for t in graph.tensors_with_role("parameter") if not t.name.startswith("adam."))
    print(f"{graph.name}: {weights:,} weights, batch {args.batch} x seq {args.seq}\n")
    print("| microbatches | state per weight | peak per weight | peak | at op | parameters at peak | activations at peak |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for count in [1] + [m for m in args.microbatches if m > 1]:
        if count == 1:
            report = estimate(replicated(graph, mesh), hw)
        else:
            split = microbatch(graph, count)
            report = estimate(replicated(split.graph, mesh), hw, split)
        print(f"| {count} | {report.parameter_bytes / weights:.2f} B | {report.peak_memory_bytes / weights:.2f} B "
              f"| {size(report.peak_memory_bytes)} | `{report.peak_op}` | {size(report.parameter_bytes)} "
              f"| {size(report.activation_peak_bytes)} |")


if __name__ == "__main__":
    main()
