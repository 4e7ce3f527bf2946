"""Ops that read through windows, split with halos: the options' shardings and halos, the
alignment rule, the partitioned op on halo shards equal to the unsharded op in the simulator
(at the tensor's edges too, where the halo holds padding), and plans with height splits
partitioned, priced, emitted and simulated."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from autoshard.errors import ShardingError
from autoshard.graph.model import Op
from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.mlir import emit_annotated, emit_partitioned
from autoshard.mlir.toolchain import verify_all
from autoshard.ops import OP_KINDS, evaluate
from autoshard.planning.hardware import bind_hardware
from autoshard.planning.make_plan import SolveSettings, make_plan
from autoshard.planning.options import (ShardingOption, check_option, enumerate_options, operand_shardings,
                                        result_shardings)
from autoshard.planning.plan import Plan
from autoshard.sharding import Sharding
from autoshard.sim import assemble, distribute
from autoshard.sim.local_op import Placed, run_local_op
from autoshard.sim.program import verify_plan
from autoshard.spmd.program import partition
from support.graphs import graph_doc


def make_op(kind: str, shapes, attrs) -> Op:
    nest = OP_KINDS[kind].loops(shapes, attrs)
    inputs = tuple(f"in{i}" for i in range(len(shapes)))
    return Op("op", kind, inputs, ("out",), attrs, nest)


def run_partitioned(op: Op, option: ShardingOption, mesh: Mesh, inputs: list[np.ndarray]) -> np.ndarray:
    """Lay every input out in the sharding the option reads (halos filled from the neighbours,
    padding cells zero), run each device's block, assemble the result."""
    placed = [Placed(distribute(x, mesh, s), s, x.shape) for x, s in zip(inputs, operand_shardings(op.nest, option))]
    (out_sharding,) = result_shardings(op.nest, option)
    shape = op.nest.output_shapes()[0]
    (shards,) = run_local_op(mesh, op, option, placed, [(out_sharding, shape, "f64")])
    return assemble(shards, mesh, out_sharding, shape)


def conv_option(nest, mesh_axes: dict[int, tuple[str, ...]]) -> ShardingOption:
    return ShardingOption(tuple(mesh_axes.get(loop, ()) for loop in range(nest.num_loops)))


def test_3x3_conv_with_padding_1_split_over_height_reads_one_halo_row_each_side():
    mesh = Mesh.of(x=4)
    op = make_op("conv2d", [(2, 16, 8, 3), (3, 3, 3, 5)], {"padding": [[1, 1], [1, 1]]})
    option = conv_option(op.nest, {1: ("x",)})
    x_sharding, w_sharding = operand_shardings(op.nest, option)
    assert x_sharding == Sharding(((), ("x",)), halo_sizes=((0, 0), (1, 1)))
    assert x_sharding.to_json() == {"split_axes": [[], ["x"]], "halo_sizes": [1, 1]}
    assert w_sharding == Sharding()
    assert result_shardings(op.nest, option) == (Sharding(((), ("x",))),)
    # each device's box: its 4 rows and one row on each side; rows -1 and 16 are padding
    boxes = [x_sharding.device_box(mesh, (2, 16, 8, 3), (k,))[1] for k in range(4)]
    assert boxes == [(-1, 5), (3, 9), (7, 13), (11, 17)]
    rng = np.random.default_rng(0)
    inputs = [rng.uniform(-1, 1, (2, 16, 8, 3)), rng.uniform(-1, 1, (3, 3, 3, 5))]
    (expected,) = evaluate(op.op_kind, op.nest, op.attrs, inputs)
    np.testing.assert_allclose(run_partitioned(op, option, mesh, inputs), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind, shapes, attrs, halo", [
    ("conv2d", [(1, 16, 8, 2), (3, 3, 2, 2)], {"padding": [[1, 1], [1, 1]]}, (1, 1)),
    ("conv2d", [(1, 16, 8, 2), (5, 3, 2, 2)], {"padding": [[2, 2], [1, 1]]}, (2, 2)),
    ("conv2d", [(1, 16, 8, 2), (3, 3, 2, 2)], {"padding": [[0, 0], [1, 1]]}, (0, 2)),  # valid rows: 14 outputs
    ("conv2d", [(1, 16, 8, 2), (3, 3, 2, 2)], {"strides": [2, 1], "padding": [[1, 1], [1, 1]]}, (1, 0)),
    ("conv2d", [(1, 16, 8, 2), (4, 3, 2, 2)], {"strides": [2, 1], "padding": [[1, 1], [1, 1]]}, (1, 1)),
    ("max_pool2d", [(1, 16, 8, 2)], {"window": [3, 3], "strides": [1, 1], "padding": [[1, 1], [1, 1]]}, (1, 1)),
    ("max_pool2d", [(1, 16, 8, 2)], {"window": [2, 2]}, (0, 0)),
])
def test_the_halo_is_what_the_window_reaches_past_the_block(kind, shapes, attrs, halo):
    """start = pad, end = kernel - stride - pad (none if negative): an input block of stride x the
    output block reads pad cells before it and (out - 1) * stride + kernel - pad - stride * out after."""
    nest = OP_KINDS[kind].loops(shapes, attrs)
    (window,) = nest.windows(1)
    assert window.halo == halo
    assert window.aligned(4)


def test_a_split_whose_input_block_is_not_stride_output_blocks_is_not_offered():
    # 15 rows at stride 2 give 8 outputs: 4 ways, output blocks of 2 read input blocks of 4, not ceil(15/4) = 4...
    # ...but 3 ways give output blocks of 3 (6 input rows) against input blocks of 5: no regular halo
    nest = OP_KINDS["conv2d"].loops([(1, 15, 4, 1), (3, 3, 1, 1)], {"strides": [2, 1], "padding": [[1, 1], [1, 1]]})
    (window,) = nest.windows(1)
    assert window.aligned(4) and not window.aligned(3)
    mesh = Mesh.of(x=3)
    assert all(not o.loop_axes[1] for o in enumerate_options(nest, mesh))
    with pytest.raises(ShardingError, match="cannot be split 3 ways: its input windows need a halo"):
        check_option(nest, conv_option(nest, {1: ("x",)}), mesh)


def test_kernel_loops_and_window_results_stay_whole():
    nest = OP_KINDS["conv2d"].loops([(1, 8, 8, 2), (3, 3, 2, 4)], {"padding": [[1, 1], [1, 1]]})
    assert nest.splittable_loops() == (0, 1, 2, 3, 6)
    # the input gradient of a pooling writes through the window: its spatial loops stay whole
    grad = OP_KINDS["grad"].loops([(1, 8, 8, 2), (1, 8, 8, 2)], {"of": "max_pool2d", "wrt": 0,
                                                                 "forward": {"window": [3, 3], "strides": [1, 1],
                                                                             "padding": [[1, 1], [1, 1]]}})
    assert 1 not in grad.splittable_loops() and 2 not in grad.splittable_loops()


def test_max_pool_edges_read_the_lowest_value_not_the_halos_zero_padding():
    """All inputs negative: a zero read from the halo's padding would win every edge window."""
    mesh = Mesh.of(x=2, y=2)
    op = make_op("max_pool2d", [(1, 8, 8, 2)], {"window": [3, 3], "strides": [1, 1], "padding": [[1, 1], [1, 1]]})
    option = conv_option(op.nest, {1: ("x",), 2: ("y",)})
    x = -np.random.default_rng(1).uniform(1, 2, (1, 8, 8, 2))
    (expected,) = evaluate(op.op_kind, op.nest, op.attrs, [x])
    assert (expected < 0).all()
    np.testing.assert_array_equal(run_partitioned(op, option, mesh, [x]), expected)


WINDOW_KINDS = ["conv1d", "conv2d", "conv3d", "max_pool2d", "avg_pool2d"]


@st.composite
def windowed_ops(draw):
    kind = draw(st.sampled_from(WINDOW_KINDS))
    rank = 2 if "pool" in kind else int(kind[4])
    kernel = [draw(st.integers(1, 4)) for _ in range(rank)]
    strides = [draw(st.integers(1, 3)) for _ in range(rank)]
    pad = [[draw(st.integers(0, k - 1)), draw(st.integers(0, k - 1))] for k in kernel]
    spatial = [draw(st.integers(max(k, 2), 13)) for k in kernel]
    n, c = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    x = (n, *spatial, c)
    if "pool" in kind:
        return kind, [x], {"window": kernel, "strides": strides, "padding": pad}
    return kind, [x, (*kernel, c, draw(st.integers(1, 3)))], {"strides": strides, "padding": pad}


MESHES = [Mesh.of(x=2), Mesh.of(x=3), Mesh.of(x=4), Mesh.of(x=2, y=2), Mesh.of(x=2, y=3)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=windowed_ops(), mesh_index=st.integers(0, len(MESHES) - 1), choice=st.randoms(use_true_random=False))
def test_partitioned_windows_with_halos_equal_the_unsharded_op(case, mesh_index, choice):
    kind, shapes, attrs = case
    mesh = MESHES[mesh_index]
    op = make_op(kind, shapes, attrs)
    spatial = [l for l in range(1, len(shapes[0]) - 1) if op.nest.windows(l)]
    options = [o for o in enumerate_options(op.nest, mesh) if any(o.loop_axes[l] for l in spatial)]
    assume(options)
    option = choice.choice(options)
    rng = np.random.default_rng(2)
    inputs = [rng.uniform(-2, -0.5, s) if kind == "max_pool2d" else rng.uniform(-1, 1, s) for s in shapes]
    (expected,) = evaluate(op.op_kind, op.nest, op.attrs, inputs)
    np.testing.assert_allclose(run_partitioned(op, option, mesh, inputs), expected, rtol=1e-12, atol=1e-12,
                               err_msg=f"{kind} {shapes} {attrs} option {option} on {mesh}")


# --- planned, partitioned, emitted --------------------------------------------------------
def conv_graph(mesh: Mesh):
    doc = graph_doc("conv3x3", {"x": ((2, 16, 8, 3), "f32", "input"), "w": ((3, 3, 3, 5), "f32", "parameter"),
                                "y": ((2, 16, 8, 5), "f32")},
                    [("conv", "conv2d", ["x", "w"], ["y"], {"padding": [[1, 1], [1, 1]]})])
    return graph_from_json(doc, mesh)


def test_known_answer_3x3_conv_height_split_over_4_devices_exchanges_two_rows_per_device():
    """Halo 1 at each interior boundary and none at the edges: one update_halo for the conv's
    input, priced as the two rows an interior device receives; the program runs exactly and its
    IR passes the verifiers."""
    mesh = Mesh.of(x=4)
    graph = conv_graph(mesh)
    op = graph.ops[0]
    plan = Plan(graph, mesh, {"conv": conv_option(op.nest, {1: ("x",)})},
                {"x": Sharding(((), ("x",))), "w": Sharding()})
    program = partition(plan)
    (exchange,) = program.communicates()
    step = exchange.step
    assert (step.kind, exchange.input.tensor) == ("update_halo", "x")
    assert step.before == Sharding(((), ("x",))) and step.after == Sharding(((), ("x",)), halo_sizes=((0, 0), (1, 1)))
    row_bytes = 2 * 8 * 3 * 4  # batch x width x channels x f32
    assert step.bytes_per_device == 2 * row_bytes
    assert step.in_local_shape == (2, 4, 8, 3) and step.out_local_shape == (2, 6, 8, 3)
    assert step.seconds > 0
    verdict = verify_plan(plan)
    assert verdict.passed, verdict
    texts = {spelling: emit_partitioned(plan, spelling) for spelling in ("mesh", "shard")}
    assert texts["mesh"].count("mesh.update_halo") == 1 and texts["shard"].count("shard.update_halo") == 1
    assert "split_axes = [[], [0]] source_halo_sizes = [0, 0] destination_halo_sizes = [1, 1]" in texts["mesh"]
    assert "linalg.conv_2d_nhwc_hwcf" in texts["shard"] and "low[0, 0, 1, 0] high[0, 0, 1, 0]" in texts["shard"]
    for spelling, text in texts.items():
        verify_all([text, emit_annotated(plan, spelling)], spelling)


def test_a_planner_under_a_memory_budget_splits_height_and_the_plan_simulates_exactly():
    """One image and one channel: only height and width splits shrink the activations."""
    mesh = Mesh.of(x=4)
    doc = graph_doc("stencils", {"x": ((1, 32, 32, 1), "f32", "input"), "w": ((3, 3, 1, 1), "f32", "parameter"),
                                 "v": ((3, 3, 1, 1), "f32", "parameter"), "y": ((1, 32, 32, 1), "f32"),
                                 "z": ((1, 32, 32, 1), "f32"), "p": ((1, 16, 16, 1), "f32")},
                    [("conv1", "conv2d", ["x", "w"], ["y"], {"padding": [[1, 1], [1, 1]]}),
                     ("conv2", "conv2d", ["y", "v"], ["z"], {"padding": [[1, 1], [1, 1]]}),
                     ("pool", "max_pool2d", ["z"], ["p"], {"window": [2, 2]})], ["p"])
    graph = graph_from_json(doc, mesh)
    hw = bind_hardware("dgx-h100", mesh)
    free = make_plan(graph, mesh, hw, SolveSettings(time_limit_s=20))
    budget = 0.5 * free.report.peak_memory_bytes
    result = make_plan(graph, mesh, hw, SolveSettings(time_limit_s=20, memory_budget_bytes=budget))
    assert result.report.peak_memory_bytes <= budget
    assert all(any(result.plan.options[name].loop_axes[1:3]) for name in ("conv1", "conv2"))
    program = partition(result.plan)
    assert any(c.step.kind == "update_halo" for c in program.communicates())
    assert verify_plan(result.plan).passed


def test_plans_for_dtensor_split_no_window_that_needs_halos():
    """DTensor's placements have no halos: with mesh-order splits only batch and channels split."""
    nest = OP_KINDS["conv2d"].loops([(2, 16, 16, 4), (3, 3, 4, 4)], {"padding": [[1, 1], [1, 1]]})
    mesh = Mesh.of(x=2, y=2)
    assert any(o.loop_axes[1] for o in enumerate_options(nest, mesh))
    assert not any(o.loop_axes[1] or o.loop_axes[2] for o in enumerate_options(nest, mesh, mesh_order=True))
    # a 2x2 pooling's windows tile the input: no halo, so DTensor plans may still split them
    pool = OP_KINDS["max_pool2d"].loops([(2, 16, 16, 4)], {"window": [2, 2]})
    assert any(o.loop_axes[1] for o in enumerate_options(pool, mesh, mesh_order=True))
