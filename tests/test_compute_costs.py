"""What an op's compute costs: the bytes of a chain of pointwise ops are its inputs and outputs
only (the values between are fused, never in memory), and a contraction runs at the measured
rate of its GEMM's shape on a device (the profile's sweep) where the profile has one."""

from __future__ import annotations

import pytest
from test_megatron_layer import CONFIG

from autoshard import bind_hardware
from autoshard.graph.builder import GraphBuilder
from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.models import gpt
from autoshard.models.training import training_precision
from autoshard.planning.costs import gemm_shape, op_cost
from autoshard.planning.options import ShardingOption

MESH = Mesh.of(tp=4)
N = 1 << 20


def whole(op) -> ShardingOption:
    return ShardingOption.replicated(op.nest.num_loops)


def chain_graph():
    b = GraphBuilder("chain", "bf16")
    x, y = b.input("x", [N]), b.input("y", [N])
    s = b.op("add", [x, y], "s")           # read by pointwise ops only: fused
    e = b.op("exp", [s], "e")              # read by a pointwise op and a reduction: written
    m = b.op("mul", [e, s], "m")           # the graph's output: written
    total = b.op("reduce_sum", [e], "total", dims=[0])
    b.mark_outputs(m, total)
    return graph_from_json(b.document(), MESH)


def test_a_value_only_pointwise_ops_read_is_fused_and_moves_no_bytes():
    graph = chain_graph()
    assert graph.fused == {"s"}
    hw = bind_hardware("dgx-h100", MESH)
    moved = {op.name: op_cost(graph, op, whole(op), MESH, hw).bytes for op in graph.ops}
    element = 2  # bf16
    assert moved == {"s": 2 * N * element,        # reads x and y, writes nothing
                     "e": N * element,            # reads s inside the kernel, writes e
                     "m": 2 * N * element,        # reads e (s inside the kernel), writes m
                     "total": N * element + element}
    seconds = op_cost(graph, graph.op_by_name["m"], whole(graph.op_by_name["m"]), MESH, hw).seconds
    assert seconds == pytest.approx(2 * N * element / hw.hbm_bytes_per_s)


def test_a_value_the_backward_reads_from_the_forward_is_not_fused_and_the_optimizer_chain_is():
    with training_precision("bf16-mixed"):
        graph = graph_from_json(gpt(CONFIG, training=True), Mesh.of(tp=1))
    phases = graph.phases
    later = {t for op in graph.ops if phases[op.name] != "forward" for t in op.inputs}
    forward = {t for op in graph.ops if phases[op.name] == "forward" for t in op.outputs}
    assert "layer0.mlp.fc1" in later and "layer0.mlp.fc1" not in graph.fused  # GeLU's input, kept for its backward
    assert not graph.fused & forward & later
    optimizer = {t for op in graph.ops if phases[op.name] == "optimizer" for t in op.outputs}
    assert len(graph.fused & optimizer) > len(optimizer) / 2  # Adam's update, one pass a parameter
    assert not graph.fused & (set(graph.updated_by.values()) | set(graph.gradients.values()) | set(graph.outputs))


@pytest.mark.parametrize("mesh_split, expected", [((), (1, 512, 1024, 2048)), ((("tp",),), (1, 512, 256, 2048))])
def test_a_contraction_is_priced_at_its_gemm_shapes_measured_rate(mesh_split, expected):
    b = GraphBuilder("gemm", "bf16")
    a, w = b.input("a", [512, 2048]), b.parameter("w", [2048, 1024])
    b.mark_outputs(b.op("matmul", [a, w], "y"))
    graph = graph_from_json(b.document(), MESH)
    op = graph.op_by_name["y"]
    loops = {"m": 0, "n": 1, "k": 2}  # matmul's loops: rows, columns, summed
    option = whole(op) if not mesh_split else ShardingOption(tuple(("tp",) if l == loops["n"] else () for l in range(3)))
    splits = tuple(MESH.group_size(axes) if axes else 1 for axes in option.loop_axes)
    assert gemm_shape(op, splits) == expected
    hw = bind_hardware("dgx-h100", MESH)
    cost = op_cost(graph, op, option, MESH, hw)
    rate = hw.peak_flops("bf16") * hw.matmul_efficiency("bf16", expected)
    assert cost.bound == "compute" and cost.seconds == pytest.approx(cost.flops / rate)
    assert hw.matmul_efficiency("bf16", expected) < hw.matmul_efficiency("bf16")  # slower than the best shape
    a100 = bind_hardware("dgx-a100", MESH)  # no published sweep: the best rate at every shape
    assert op_cost(graph, op, option, MESH, a100).seconds == pytest.approx(
        cost.flops / (a100.peak_flops("bf16") * a100.matmul_efficiency("bf16")))
