"""One op on every device (blocks, operand cuts, partial results, empty blocks) and the
device-by-device comparison with the reference."""

from __future__ import annotations

import numpy as np
import pytest

from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.planning.options import ShardingOption, operand_shardings, result_shardings
from autoshard.reductions import REDUCTIONS
from autoshard.sharding import Sharding
from autoshard.sim import assemble, distribute
from autoshard.sim.compare import compare_shards, tolerance
from autoshard.sim.local_op import Placed, ProgramError, loop_block, run_local_op
from autoshard.sim.precision import widen_graph, widen_inputs
from autoshard.sim.program import comparison_dtypes

MESH = Mesh.of(x=4)
MESH_2x2 = Mesh.of(x=2, y=2)
rng = np.random.default_rng(3)


def one_op(kind: str, shapes: list[list[int]], out: list[int], dtype: str = "f32", **attrs):
    tensors = {f"in{i}": {"shape": s, "dtype": dtype, "role": "input"} for i, s in enumerate(shapes)}
    tensors["out"] = {"shape": out, "dtype": dtype}
    doc = {"format": "autoshard.graph/v1", "tensors": tensors,
           "ops": [{"name": "the_op", "kind": kind, "inputs": list(tensors)[:-1], "outputs": ["out"], **attrs}]}
    return graph_from_json(doc).ops[0]


def run(op, mesh, option, arrays, input_shardings=None, dtype="f32"):
    """Lay the inputs out as the option needs (or as given), run the op, return the result's
    device contents and sharding."""
    needed = input_shardings or operand_shardings(op.nest, option)
    placed = [Placed(distribute(a, mesh, s), s, a.shape) for a, s in zip(arrays, needed)]
    (sharding,) = result_shardings(op.nest, option)
    shape = op.nest.output_shapes()[0]
    (shards,) = run_local_op(mesh, op, option, placed, [(sharding, shape, dtype)])
    return shards, sharding, shape


def test_blocks_are_the_ceildiv_pieces_of_the_in_group_index():
    op = one_op("matmul", [[5, 6], [6, 3]], [5, 3])
    option = ShardingOption((("x",), (), ()))
    starts = [loop_block(MESH, op.nest, option, (d,)).starts[0] for d in range(4)]
    sizes = [loop_block(MESH, op.nest, option, (d,)).sizes[0] for d in range(4)]
    assert starts == [0, 2, 4, 5] and sizes == [2, 2, 1, 0]
    # Two axes on one loop: the first is major, as in the sharding's in-group order.
    two = ShardingOption((("y", "x"), (), ()))
    assert [loop_block(MESH_2x2, op.nest, two, d).starts[0] for d in [(0, 0), (1, 0), (0, 1), (1, 1)]] == [0, 2, 4, 5]


def test_split_contraction_gives_partial_sums_that_reduce_to_the_product():
    op = one_op("matmul", [[3, 7], [7, 2]], [3, 2])
    a, b = rng.standard_normal((3, 7)), rng.standard_normal((7, 2))
    option = ShardingOption(((), ("y",), ("x",)))  # N over y, K over x
    shards, sharding, shape = run(op, MESH_2x2, option, [a, b], dtype="f64")
    assert sharding == Sharding(((), ("y",)), ("x",))
    assert shards[(0, 0)].shape == (3, 1)
    np.testing.assert_allclose(assemble(shards, MESH_2x2, sharding, shape), a @ b)
    assert not np.allclose(shards[(0, 0)], (a @ b)[:, :1]), "one device alone holds only part of the sum"


@pytest.mark.parametrize("kind, reduction", [("reduce_sum", "sum"), ("reduce_max", "max"), ("reduce_min", "min")])
@pytest.mark.parametrize("dtype", ["f32", "i32"])
def test_empty_reduction_block_contributes_the_identity(kind, reduction, dtype):
    # 3 split 4 ways: the last device has nothing of the reduced dim.
    op = one_op(kind, [[2, 3]], [2], dtype=dtype, dims=[1])
    x = rng.integers(-5, 5, (2, 3)).astype(np.float32 if dtype == "f32" else np.int32)
    shards, sharding, shape = run(op, MESH, ShardingOption(((), ("x",))), [x], dtype=dtype)
    np_dtype = x.dtype
    np.testing.assert_array_equal(shards[(3,)], np.full(2, REDUCTIONS[reduction].identity(np_dtype), np_dtype))
    expected = {"reduce_sum": x.sum(1), "reduce_max": x.max(1), "reduce_min": x.min(1)}[kind]
    np.testing.assert_array_equal(assemble(shards, MESH, sharding, shape), expected)


def test_empty_parallel_block_computes_an_empty_shard():
    op = one_op("softmax", [[5, 3]], [5, 3])
    x = rng.standard_normal((5, 3)).astype(np.float32)
    shards, sharding, shape = run(op, MESH, ShardingOption((("x",), ())), [x])
    assert shards[(3,)].shape == (0, 3)
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(assemble(shards, MESH, sharding, shape), e / e.sum(1, keepdims=True), rtol=1e-6)


def test_operands_are_cut_from_a_coarser_shard():
    # The op splits rows over x, but its input is replicated: each device reads its rows of it.
    op = one_op("relu", [[6, 2]], [6, 2])
    x = rng.standard_normal((6, 2))
    shards, sharding, shape = run(op, MESH, ShardingOption((("x",), ())), [x], input_shardings=[Sharding()], dtype="f64")
    np.testing.assert_array_equal(assemble(shards, MESH, sharding, shape), np.maximum(x, 0))


def test_an_operand_range_the_device_does_not_hold_names_op_input_and_device():
    # Rows split over x in the op, but the input is split over y: device (0, 1) holds rows 3..6.
    op = one_op("relu", [[6, 2]], [6, 2])
    x = rng.standard_normal((6, 2))
    with pytest.raises(ProgramError, match=r"op 'the_op' on device \[0, 1\] reads \[\[0, 3\), \[0, 2\)\] of input 0 "
                                           r"\('in0'\) but the device holds \[\[3, 6\), \[0, 2\)\]") as error:
        run(op, MESH_2x2, ShardingOption((("x",), ())), [x], input_shardings=[Sharding((("y",),))])
    assert error.value.op == "the_op" and error.value.device == (0, 1)


def test_a_result_sharding_that_differs_from_the_block_is_a_program_error():
    op = one_op("relu", [[6, 2]], [6, 2])
    x = rng.standard_normal((6, 2))
    placed = [Placed(distribute(x, MESH, Sharding()), Sharding(), x.shape)]
    with pytest.raises(ProgramError, match="computes .* of result 0 \\('out'\\), but sharding \\[\\[\\], \\[x\\]\\]"):
        run_local_op(MESH, op, ShardingOption((("x",), ())), placed, [(Sharding(((), ("x",))), (6, 2), "f32")])


def test_comparison_reduces_partials_and_names_the_first_device_and_global_index():
    reference = np.arange(24, dtype=np.float32).reshape(4, 6)
    sharding = Sharding((("x",),), ("y",))
    shards = distribute(reference, MESH_2x2, sharding)
    ok = compare_shards(shards, MESH_2x2, sharding, reference, "f32", "t")
    assert ok.mismatch is None and ok.max_error == 0.0
    shards[(1, 1)] = shards[(1, 1)].copy()
    shards[(1, 1)][1, 4] += 0.5  # the partial group (1, *) now sums to 18.5 at global [3, 4]
    bad = compare_shards(shards, MESH_2x2, sharding, reference, "f32", "t")
    assert bad.mismatch is not None
    assert (bad.mismatch.device, bad.mismatch.index) == ((1, 0), (3, 4))  # first device of the group
    assert (bad.mismatch.actual, bad.mismatch.expected) == (22.5, 22.0) and bad.max_error == 0.5


def test_tolerance_follows_the_dtype_and_the_magnitude():
    big = np.array([-300.0, 2.0])
    assert tolerance("f64", big) == pytest.approx(3e-7)
    assert tolerance("f32", np.array([0.5])) == pytest.approx(1e-4)
    assert tolerance("bf16", big) == pytest.approx(3e-2)
    assert tolerance("f16", np.array([np.inf, 4.0])) == pytest.approx(4e-2)
    assert tolerance("i32", big) == 0.0


def test_a_nan_reference_is_refused_naming_the_tensor_and_the_element():
    reference = np.array([1.0, np.nan, np.inf, np.nan])
    same = {d: reference.copy() for d in MESH.devices()}  # the same NaN on every device is no evidence
    with pytest.raises(ProgramError, match=r"value t: the reference is NaN at \[1\] \(2 of 4 elements\)"):
        compare_shards(same, MESH, Sharding(), reference, "f64", "value t")


def test_an_infinity_of_the_reference_must_be_the_same_infinity_on_every_device():
    reference = np.array([1.0, -np.inf, np.inf, 4.0])  # log(0) a later select discards, as in T5
    same = {d: reference.copy() for d in MESH.devices()}
    result = compare_shards(same, MESH, Sharding(), reference, "f64", "t")
    assert result.mismatch is None and result.max_error == 0.0
    for wrong in (np.inf, 7.0, np.nan):
        other = {d: np.array([1.0, wrong, np.inf, 4.0]) for d in MESH.devices()}
        result = compare_shards(other, MESH, Sharding(), reference, "f64", "t")
        assert result.mismatch is not None and result.mismatch.index == (1,) and result.max_error == np.inf


def test_a_nan_or_an_infinity_on_a_device_is_a_mismatch_against_a_finite_reference():
    reference = np.array([1.0, 2.0, 3.0, 4.0])
    other = {d: np.array([1.0, 2.0, np.inf, np.nan]) for d in MESH.devices()}
    result = compare_shards(other, MESH, Sharding(), reference, "f64", "t")
    assert result.mismatch is not None and result.mismatch.index == (2,) and result.max_error == np.inf


def test_a_shard_of_the_wrong_shape_is_a_program_error_naming_the_device():
    reference = np.zeros((4, 2))
    shards = distribute(reference, MESH, Sharding((("x",),)))
    shards[(2,)] = np.zeros((2, 2))
    with pytest.raises(ProgramError, match=r"device \[2\] holds shape \[2, 2\]; sharding \[\[x\]\] of \[4, 2\] gives \[1, 2\]"):
        compare_shards(shards, MESH, Sharding((("x",),)), reference, "f64", "value t")


def test_widening_computes_floats_in_float64_and_keeps_integers():
    doc = {"format": "autoshard.graph/v1", "name": "casts",
           "tensors": {"ids": {"shape": [3], "dtype": "i32", "role": "input"},
                       "x": {"shape": [3], "dtype": "bf16", "role": "input"},
                       "f": {"shape": [3], "dtype": "f32"}, "h": {"shape": [3], "dtype": "f16"},
                       "s": {"shape": [3], "dtype": "f16"}},
           "ops": [{"name": "to_float", "kind": "cast", "inputs": ["ids"], "outputs": ["f"], "dtype": "f32"},
                   {"name": "narrow", "kind": "cast", "inputs": ["f"], "outputs": ["h"], "dtype": "f16"},
                   {"name": "add", "kind": "add", "inputs": ["h", "h"], "outputs": ["s"]}]}
    graph = graph_from_json(doc)
    wide = widen_graph(graph)
    assert {n: t.dtype for n, t in wide.tensors.items()} == {"ids": "i32", "x": "f64", "f": "f64", "h": "f64", "s": "f64"}
    assert [op.attrs.get("dtype") for op in wide.ops] == ["f64", "f64", None]
    inputs = widen_inputs({"ids": np.arange(3, dtype=np.int32), "x": np.ones(3, np.float32)})
    assert inputs["ids"].dtype == np.int32 and inputs["x"].dtype == np.float64
    assert comparison_dtypes(graph, widen=True) == {"i32": "i32", "bf16": "f64", "f32": "f64", "f16": "f64"}
    # In the declared dtypes a float may carry a narrower float's rounding: the loosest tolerance.
    assert comparison_dtypes(graph, widen=False) == {"i32": "i32", "bf16": "f16", "f32": "f16", "f16": "f16"}
