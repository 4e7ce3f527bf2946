"""Compute and memory model of one op under one option, per device.

Compute time is a roofline: the larger of the local FLOPs at the chip's peak for the dtype
(times its matmul efficiency) and the local bytes moved at HBM bandwidth. Work is split over
the split loops; loops left whole are computed redundantly on every device of those axes,
which is exactly what the per-device local extents express.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, Sequence

from autoshard.graph.model import Graph, Op
from autoshard.mesh import Mesh
from autoshard.planning.options import ShardingOption, operand_shardings, result_shardings
from autoshard.sharding import Sharding


class Hardware(Protocol):
    """What the cost models need of a topology bound to a mesh (see `cost_models`)."""

    hbm_bytes: float
    hbm_bytes_per_s: float

    def peak_flops(self, dtype: str) -> float: ...

    def matmul_efficiency(self, dtype: str) -> float: ...

    def collective_seconds(self, kind: str, axes: Sequence[str], bytes_per_device: float) -> float: ...


@dataclass(frozen=True, slots=True)
class OpCost:
    flops: float  # per device
    bytes: float  # per device, operands read plus results written
    seconds: float
    bound: str  # "compute" or "memory"


def tensor_bytes(shape: Sequence[int], itemsize: int, sharding: Sharding, mesh: Mesh) -> int:
    """Bytes one device holds (the largest shard: every device allocates that much)."""
    return math.prod(sharding.max_local_shape(mesh, shape)) * itemsize


def device_flops(op: Op, option: ShardingOption, mesh: Mesh) -> float:
    """FLOPs of the busiest device: the op's FLOPs times the share of its largest block, or of
    its busiest one where the work is uneven (causal attention)."""
    splits = tuple(mesh.group_size(axes) if axes else 1 for axes in option.loop_axes)
    return op.flops() * op.op_kind.block_share(op.nest, op.attrs, splits)


def op_cost(graph: Graph, op: Op, option: ShardingOption, mesh: Mesh, hw: Hardware) -> OpCost:
    nest = op.nest
    flops = device_flops(op, option, mesh)
    shardings = operand_shardings(nest, option) + result_shardings(nest, option)
    moved = sum(tensor_bytes(graph.tensors[t].shape, graph.tensors[t].itemsize, s, mesh)
                for t, s in zip(op.operands, shardings))
    compute_s = flops / flops_per_s(graph, op, hw) if flops else 0.0
    memory_s = moved / hw.hbm_bytes_per_s
    return OpCost(flops, moved, max(compute_s, memory_s), "compute" if compute_s >= memory_s else "memory")


def flops_per_s(graph: Graph, op: Op, hw: Hardware) -> float:
    """The rate an op computes at on one device: the chip's peak for its (first input's) dtype
    times the matmul efficiency."""
    dtype = graph.tensors[op.inputs[0]].dtype if op.inputs else graph.tensors[op.outputs[0]].dtype
    return hw.peak_flops(dtype) * hw.matmul_efficiency(dtype)


def least_compute_s(graph: Graph, op: Op, devices: int, hw: Hardware) -> float:
    """At most `op_cost(...).seconds` of any option on any mesh of `devices` devices: an option
    splits the loops over at most every device (each mesh axis once), so a device computes at
    least the op's FLOPs over the devices (more where a split is uneven or loops stay whole), at
    the same rate; the roofline's memory side only adds."""
    flops = op.flops()
    return flops / (devices * flops_per_s(graph, op, hw)) if flops else 0.0


def result_bytes(graph: Graph, op: Op, option: ShardingOption, mesh: Mesh) -> int:
    """Per-device bytes of the op's results under `option` (the activation memory it adds): none
    for a view, which holds its input's storage."""
    if op.op_kind.view:
        return 0
    return sum(tensor_bytes(graph.tensors[t].shape, graph.tensors[t].itemsize, s, mesh)
               for t, s in zip(op.outputs, result_shardings(op.nest, option)))
