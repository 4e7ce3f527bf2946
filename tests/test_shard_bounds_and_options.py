"""Affine maps, shard bounds (uneven splits), and options <-> shardings in both directions."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoshard.affine import AffineExpr, AffineMap
from autoshard.errors import InputError, ShardingError
from autoshard.mesh import Mesh
from autoshard.mlir.module import sharding_attrs
from autoshard.ops import OP_KINDS
from autoshard.planning.options import (
    ShardingOption,
    check_option,
    operand_shardings,
    options_consistent_with,
    result_shardings,
)
from autoshard.sharding import Sharding


@pytest.mark.parametrize("text", [
    "(d0, d1, d2) -> (d0, d2)", "(d0, d1, d2) -> (d1 * 64 + d2)", "(d0, d1) -> (0, d1)", "(d0) -> (d0 - 3)",
    "() -> ()", "(d0, d1) -> (d1 * 2 + d0 * 8 + 1)",
])
def test_affine_parse_print_round_trip(text):
    parsed = AffineMap.parse(text)
    assert AffineMap.parse(str(parsed)) == parsed


@given(st.integers(1, 4).flatmap(lambda n: st.tuples(
    st.just(n), st.lists(st.tuples(st.lists(st.tuples(st.integers(0, n - 1), st.integers(-5, 5)), max_size=3),
                                   st.integers(-9, 9)), min_size=1, max_size=4))))
@settings(max_examples=200, derandomize=True)
def test_affine_round_trip_property(case):
    n, results = case
    exprs = []
    for terms, const in results:
        e = AffineExpr.constant(const)
        for loop, c in terms:
            e = e + AffineExpr.loop(loop, c)
        exprs.append(e)
    m = AffineMap(n, tuple(exprs))
    assert AffineMap.parse(str(m)) == m
    point = tuple(range(2, 2 + n))
    assert m.evaluate(point) == tuple(sum(point[l] * c for l, c in terms) + const for terms, const in
                                      [(list(_merge(t)), k) for t, k in results])


def _merge(terms):
    acc = {}
    for loop, c in terms:
        acc[loop] = acc.get(loop, 0) + c
    return acc.items()


def test_affine_parse_errors_say_what_is_wrong():
    with pytest.raises(InputError, match="d2 is not a loop"):
        AffineMap.parse("(d0, d1) -> (d2)")
    with pytest.raises(InputError, match="not affine"):
        AffineMap.parse("(d0, d1) -> (d0 * d1)")
    with pytest.raises(InputError, match="cannot parse"):
        AffineMap.parse("d0 -> d0")


def test_uneven_shards_follow_ceildiv_with_short_last_shard():
    mesh = Mesh.of(x=4)
    s = Sharding((("x",),))
    assert [s.local_shape(mesh, (10, 3), (i,)) for i in range(4)] == [(3, 3), (3, 3), (3, 3), (1, 3)]
    assert [s.device_slices(mesh, (10, 3), (i,))[0] for i in range(4)] == [slice(0, 3), slice(3, 6), slice(6, 9), slice(9, 10)]
    # 5 split 4 ways: ceil = 2, so the last shard is empty
    assert [s.local_shape(mesh, (5,), (i,))[0] for i in range(4)] == [2, 2, 1, 0]
    assert s.max_local_shape(mesh, (10, 3)) == (3, 3)


def test_multi_axis_split_uses_first_axis_as_major():
    mesh = Mesh.of(a=2, b=3)
    s = Sharding((("b", "a"),))
    # shard index = b * 2 + a
    starts = {d: s.device_slices(mesh, (12,), d)[0].start for d in mesh.devices()}
    assert starts == {(0, 0): 0, (1, 0): 2, (0, 1): 4, (1, 1): 6, (0, 2): 8, (1, 2): 10}


def test_explicit_offsets_override_ceildiv():
    mesh = Mesh.of(x=4)
    s = Sharding((("x",),), dims_offsets=((0, 2, 5, 9, 14),))
    s.check(mesh, (14,))
    assert [s.local_shape(mesh, (14,), (i,))[0] for i in range(4)] == [2, 3, 4, 5]
    assert "sharded_dims_offsets = [0, 2, 5, 9, 14]" in sharding_attrs(mesh, s, (14,), with_partial=True)
    with pytest.raises(ShardingError, match="rise from 0 to 14"):
        Sharding((("x",),), dims_offsets=((0, 2, 5, 14),)).check(mesh, (14,))


def test_with_split_keeps_explicit_offsets():
    mesh = Mesh.of(x=4, y=2)
    s = Sharding((("x",),), ("y",), "max", dims_offsets=((0, 2, 5, 9, 14),))
    moved = s.with_split([["x"], []])
    assert moved.dims_offsets == ((0, 2, 5, 9, 14),)
    assert (moved.partial_axes, moved.partial_kind) == (("y",), "max")
    assert [moved.local_shape(mesh, (14, 3), (i, 0))[0] for i in range(4)] == [2, 3, 4, 5]


def test_sharding_parse_forms_and_mlir_attrs():
    mesh = Mesh.of(x=2, y=3)
    short = Sharding.parse("[[x],[y]]")
    full = Sharding.parse({"split_axes": [["x"], ["y"]]})
    assert short.split_axes == full.split_axes == (("x",), ("y",))
    p = Sharding.parse('{"split_axes": [[], ["y"]], "partial": {"kind": "sum", "axes": ["x"]}}')
    assert sharding_attrs(mesh, p, (4, 6), with_partial=True) == "split_axes = [[], [1]] partial = sum[0]"
    assert Sharding.parse("[[x], []]") == Sharding.parse("[[x]]")


@pytest.mark.parametrize("document, where", [
    ({"split_axes": "x"}, "split_axes"),
    ({"split_axes": [["x"]], "partial": ["x"]}, "partial"),
    ({"split_axes": [["x"]], "partial": {"axes": "x"}}, "partial/axes"),
    ({"split_axes": [["x"]], "partial": {"kind": "max", "axes": []}}, "partial/axes"),  # partial over nothing
    ({"split_axes": [["x"]], "sharded_dims_offsets": 3}, "sharded_dims_offsets"),
    ({"split_axes": [["x"]], "sharded_dims_offsets": [[0, "2", 4]]}, "sharded_dims_offsets"),
])
def test_malformed_sharding_documents_name_the_field(document, where):
    with pytest.raises(ShardingError) as caught:
        Sharding.parse(document)
    assert caught.value.problems[0].where == where


def test_sharding_check_names_the_problem():
    mesh = Mesh.of(x=2, y=3)
    with pytest.raises(ShardingError, match="unknown mesh axis 'z'"):
        Sharding((("z",),)).check(mesh, (4,))
    with pytest.raises(ShardingError, match="used twice"):
        Sharding((("x",), ("x",))).check(mesh, (4, 4))
    with pytest.raises(ShardingError, match="rank 1"):
        Sharding(((), ("x",))).check(mesh, (4,))


MATMUL = OP_KINDS["matmul"].loops([(8, 16), (16, 32)], {})  # loops m, n, k


def test_option_to_shardings_megatron_row_split():
    # k split over tp: operands split on K, the result partial over tp
    option = ShardingOption(((), (), ("tp",)))
    lhs, rhs = operand_shardings(MATMUL, option)
    (out,) = result_shardings(MATMUL, option)
    assert lhs.split_axes == ((), ("tp",)) and rhs.split_axes == (("tp",),)
    assert out.split_axes == () and out.partial_axes == ("tp",) and out.partial_kind == "sum"


def test_option_to_shardings_2d():
    option = ShardingOption((("dp",), ("tp",), ()))
    lhs, rhs = operand_shardings(MATMUL, option)
    (out,) = result_shardings(MATMUL, option)
    assert lhs.split_axes == (("dp",),) and rhs.split_axes == ((), ("tp",)) and out.split_axes == (("dp",), ("tp",))


def test_shardings_to_options_reverse():
    mesh = Mesh.of(dp=2, tp=4)
    want = {2: Sharding((("dp",),), ("tp",))}
    assert options_consistent_with(MATMUL, mesh, want) == [ShardingOption((("dp",), (), ("tp",)))]
    assert options_consistent_with(MATMUL, mesh, {0: Sharding(((), ("tp",))), 1: Sharding((("tp",), ("dp",)))}) == \
        [ShardingOption(((), ("dp",), ("tp",)))]
    # contradictory: lhs says k over tp, rhs says k over dp
    assert options_consistent_with(MATMUL, mesh, {0: Sharding(((), ("tp",))), 1: Sharding((("dp",),))}) == []


@given(st.lists(st.sampled_from([(), ("a",), ("b",), ("a", "b"), ("b", "a")]), min_size=3, max_size=3))
@settings(max_examples=100, derandomize=True)
def test_option_shardings_option_round_trip(loop_axes):
    mesh = Mesh.of(a=2, b=2)
    option = ShardingOption(tuple(loop_axes))
    used = option.used_axes()
    if len(used) != len(set(used)):
        with pytest.raises(ShardingError):
            check_option(MATMUL, option, mesh)
        return
    implied = operand_shardings(MATMUL, option) + result_shardings(MATMUL, option)
    assert option in options_consistent_with(MATMUL, mesh, dict(enumerate(implied)))


def test_invalid_loop_cannot_be_split():
    mesh = Mesh.of(x=2)
    softmax = OP_KINDS["softmax"].loops([(4, 6)], {})
    with pytest.raises(ShardingError, match="invalid"):
        check_option(softmax, ShardingOption(((), ("x",))), mesh)
    check_option(softmax, ShardingOption((("x",), ())), mesh)


def test_reshape_only_major_loop_of_a_merge_is_splittable():
    # [2, 12] -> [24]: loops (2, 12); the result dim is d0 * 12 + d1
    nest = OP_KINDS["reshape"].loops([(2, 12)], {"shape": [24]})
    assert nest.splittable_loops() == (0,)
