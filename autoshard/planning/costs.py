"""Compute and memory model of one op under one option, per device.

Compute time is a roofline: the larger of the local FLOPs at the chip's peak for the dtype
(times its matmul efficiency, by the GEMM's shape where the profile has a measured sweep) and
the local bytes moved at HBM bandwidth, where a value fused between pointwise ops (`Graph.fused`)
moves none. Work is split over the split loops; loops left whole are computed redundantly on
every device of those axes, which is exactly what the per-device local extents express. An
attention (or its gradient) whose key loop is split adds its combine's all-reduces
(`attention_combine_seconds`); an attention realised as a ring is priced step by step
(`ring_attention_seconds`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, Sequence

from autoshard.graph.model import Graph, Op
from autoshard.mesh import Mesh
from autoshard.ops.grads import attention_key_axes
from autoshard.planning.options import ShardingOption, local_extents, operand_shardings, result_shardings
from autoshard.planning.ring_attention import kv_fraction, ring_pairs
from autoshard.sharding import Sharding


class Hardware(Protocol):
    """What the cost models need of a topology bound to a mesh (see `cost_models`)."""

    hbm_bytes: float
    hbm_bytes_per_s: float

    def peak_flops(self, dtype: str) -> float: ...

    def matmul_efficiency(self, dtype: str, gemm: tuple[int, int, int, int] | None = None) -> float: ...

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
    fused = graph.fused  # computed inside one kernel with its neighbours: never in memory
    moved = sum(tensor_bytes(graph.tensors[t].shape, graph.tensors[t].itemsize, s, mesh)
                for t, s in zip(op.operands, shardings) if t not in fused)
    splits = tuple(mesh.group_size(axes) if axes else 1 for axes in option.loop_axes)
    compute_s = flops / flops_per_s(graph, op, hw, gemm_shape(op, splits)) if flops else 0.0
    memory_s = moved / hw.hbm_bytes_per_s
    if option.ring is not None:
        return OpCost(flops, moved, ring_attention_seconds(graph, op, option, mesh, hw),
                      "compute" if compute_s >= memory_s else "memory")
    return OpCost(flops, moved, max(compute_s, memory_s) + attention_combine_seconds(graph, op, option, mesh, hw),
                  "compute" if compute_s >= memory_s else "memory")


def attention_combine_seconds(graph: Graph, op: Op, option: ShardingOption, mesh: Mesh, hw: Hardware) -> float:
    """The combine of an attention or attention gradient whose key loop is split (`ops.nn`,
    `ops.grads`): the all_reduces the simulator runs and the IR prints, over the key loop's axes,
    at the local [B, H, S] rows in the queries' dtype. Forward: max of the row maxima, sum of the
    exponent sums, sum of the weighted values [B, H, S, E]. Gradient: max of the row maxima, sum
    of the exponent sums, sum of rowsum(exp(s - M) * dP). Zero for any other op or option."""
    axes = attention_key_axes(op.kind, op.attrs, option.loop_axes)
    if not axes:
        return 0.0
    b, h, s, e = local_extents(op.nest, option, mesh)[:4]
    rows_bytes = b * h * s * graph.tensors[op.inputs[0]].itemsize
    last = rows_bytes * e if op.kind == "attention" else rows_bytes
    return (hw.collective_seconds("all_reduce", axes, rows_bytes) * 2
            + hw.collective_seconds("all_reduce", axes, last))


def ring_attention_seconds(graph: Graph, op: Op, option: ShardingOption, mesh: Mesh, hw: Hardware) -> float:
    """An attention realised as a ring over `option.ring` (`planning.ring_attention`): n steps,
    each computing the device's queries against one key/value block while the next block
    travels (a `shift` of the key block and one of the value block, at kv heads where the keys
    are repeated heads).

        pass = sum over steps j < n - 1 of max(compute_j, transfer) + compute_{n-1}

    compute_j is the roofline of the busiest device's step j (its unmasked pairs under the
    causal mask at the op's work per pair; every step reads a block of keys and values). The
    first step computes the device's own block, so the first transfer hides behind it as every
    other does and nothing is exposed before it; the last step receives nothing. A transfer
    longer than a step's compute shows as the difference. The forward is one pass. A gradient
    is two (`sim.ring_attention`): the row statistics (scores, exponents, dy v^T: the forward's
    work per pair), then the gradient, where dk's or dv's accumulator block travels with its
    keys and takes one more, exposed, step home."""
    b, h, s, e, t, d = local_extents(op.nest, option, mesh)
    n = mesh.axis_size(option.ring)
    itemsize = graph.tensors[op.inputs[0]].itemsize
    share = kv_fraction(graph, op)

    def shifts(*widths: int) -> float:  # blocks shifted one after the other on the same links
        return sum(hw.collective_seconds("shift", (option.ring,), b * h * (t // n) * w * itemsize * share)
                   for w in widths)
    pairs = ring_pairs(op, option, mesh)
    steps = [max(step) for step in zip(*pairs)]
    rate = flops_per_s(graph, op, hw)
    read_s = b * h * (t // n + s // n) * (d + e) * itemsize / hw.hbm_bytes_per_s  # a K/V block, 1/n of q and out

    def ring_pass(flops_per_pair: float, transfer: float) -> float:
        compute = [max(flops_per_pair * p / rate, read_s) for p in steps]
        return sum(max(c, transfer) for c in compute[:-1]) + compute[-1]
    per_pair = device_flops(op, option, mesh) / max(map(sum, pairs))
    if op.kind == "attention":
        return ring_pass(per_pair, shifts(d, e))
    travelling = {1: (d,), 2: (e,)}.get(op.attrs.get("wrt"), ())
    statistics = ring_pass(b * h * (2.0 * (d + e) + 5.0), shifts(d, e))
    return statistics + ring_pass(per_pair, shifts(d, e, *travelling)) + shifts(*travelling)


def flops_per_s(graph: Graph, op: Op, hw: Hardware, gemm: tuple[int, int, int, int] | None = None) -> float:
    """The rate an op computes at on one device: the chip's peak for its (first input's) dtype
    times the matmul efficiency, at the shape of its GEMM where it is one (`gemm_shape`)."""
    dtype = graph.tensors[op.inputs[0]].dtype if op.inputs else graph.tensors[op.outputs[0]].dtype
    return hw.peak_flops(dtype) * hw.matmul_efficiency(dtype, gemm)


def gemm_shape(op: Op, splits: Sequence[int]) -> tuple[int, int, int, int] | None:
    """(batch, m, n, k) of the largest block of a contraction of two operands whose loops are cut
    into `splits` blocks: batch loops are read by both operands and the result, m loops by the
    first operand and the result, n loops by the second and the result, k the summed loops. None
    for other ops (and for a contraction with a loop of another kind, as a window's)."""
    nest = op.nest
    if len(nest.input_maps) != 2 or len(nest.output_maps) != 1 or not nest.reduction_loops or nest.reduction_kind != "sum":
        return None
    reads = [{loop for expr in m.results for loop in expr.loops} for m in nest.maps]
    lhs, rhs, out = reads
    sizes = {"b": 1, "m": 1, "n": 1, "k": 1}
    for loop, (extent, split) in enumerate(zip(nest.extents, splits)):
        role = ("k" if loop in nest.reduction_loops and loop in lhs and loop in rhs and loop not in out
                else "b" if loop in lhs and loop in rhs and loop in out
                else "m" if loop in lhs and loop in out else "n" if loop in rhs and loop in out else None)
        if role is None:
            return None
        sizes[role] *= -(-extent // split)
    return sizes["b"], sizes["m"], sizes["n"], sizes["k"]


def least_compute_s(graph: Graph, op: Op, devices: int, hw: Hardware) -> float:
    """At most `op_cost(...).seconds` of any option on any mesh of `devices` devices: an option
    splits the loops over at most every device (each mesh axis once), so a device computes at
    least the op's FLOPs over the devices (more where a split is uneven or loops stay whole), at
    the chip's best rate (a GEMM's shape only slows it: `matmul_efficiency` caps the sweep at the
    best); the roofline's memory side only adds."""
    flops = op.flops()
    return flops / (devices * flops_per_s(graph, op, hw)) if flops else 0.0


def result_bytes(graph: Graph, op: Op, option: ShardingOption, mesh: Mesh) -> int:
    """Per-device bytes of the op's results under `option` (the activation memory it adds): none
    for a view, which holds its input's storage."""
    if op.op_kind.view:
        return 0
    return sum(tensor_bytes(graph.tensors[t].shape, graph.tensors[t].itemsize, s, mesh)
               for t, s in zip(op.outputs, result_shardings(op.nest, option)))
