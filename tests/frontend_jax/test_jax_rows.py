"""Rows of the primitive table for embedding lookups and routing (`gather`, `scatter`,
`scatter-add`), `top_k`, running reductions (`cumsum`, `cumprod`, `cummax`, `cummin`) and
`conv_general_dilated`: the graph computes the function's values, with the FLOPs and the loops
that may split that the op table gives them, and no opaque op."""

from __future__ import annotations

from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_jax_import import run_graph

from autoshard.errors import InputError
from autoshard.frontends.jax.importer import import_function
from autoshard.ops.loops import INVALID, PARALLEL, REDUCTION

KEY = jax.random.split(jax.random.key(7), 4)
TABLE = jax.random.normal(KEY[0], (10, 4))
IDS = jnp.array([[3, 0, 9], [3, 5, 1]], jnp.int32)
LOGITS = jax.random.normal(KEY[1], (6, 8))


def imported_values(f, *args):
    """The graph of `f` (strict: no opaque op), its results beside `f`'s, and its ops by kind."""
    imported = import_function(f, args, strict=True)
    graph, results = run_graph(imported, args)
    for got, want in zip(results, jax.tree_util.tree_leaves(f(*args)), strict=True):
        assert got.dtype == np.asarray(want).dtype
        np.testing.assert_allclose(got, np.asarray(want), rtol=1e-5, atol=1e-5)
    ops = {}
    for op in graph.ops:
        ops.setdefault(op.kind, []).append(op)
    return graph, ops


@pytest.mark.parametrize("lookup", [lambda t, i: jnp.take(t, i, axis=0), lambda t, i: t[i]], ids=["take", "index"])
def test_rows_of_a_table_are_an_embedding_whose_vocabulary_splits_as_a_sum(lookup):
    _, ops = imported_values(lookup, TABLE, IDS)
    (embedding,) = ops["embedding"]
    # ids dims and D split freely; V is a sum of masked lookups
    assert embedding.nest.iterator_types == (PARALLEL, PARALLEL, PARALLEL, REDUCTION)
    assert embedding.flops() == 0


def test_ids_out_of_range_are_clamped_in_clip_mode():
    ids = jnp.array([[-4, 12, 2]], jnp.int32)
    _, ops = imported_values(lambda t, i: jnp.take(t, i, axis=0, mode="clip"), TABLE, ids)
    assert [op.kind for op in ops["embedding"]] == ["embedding"] and len(ops["min"]) == len(ops["max"]) == 1


def test_entries_picked_along_the_last_dim_are_a_one_hot_contraction():
    def pick(x):
        _, top = jax.lax.top_k(x, 3)
        return jnp.take_along_axis(x, top, axis=-1)

    _, ops = imported_values(pick, LOGITS)
    (dot,) = ops["dot_general"]
    assert dot.flops() == 2 * 6 * 3 * 8  # a multiply-add per candidate entry of each pick
    assert dot.nest.iterator_types == (PARALLEL, PARALLEL, REDUCTION)


def test_top_k_gives_values_and_int32_indices_its_row_kept_whole():
    _, ops = imported_values(lambda x: jax.lax.top_k(x, 2), LOGITS)
    (values,) = ops["top_k_values"]
    assert values.nest.iterator_types == (PARALLEL, INVALID, INVALID)
    assert [op.attrs["dtype"] for op in ops["cast"]] == ["i32"]


def test_rows_summed_and_written_at_ids_are_scatters():
    updates = jax.random.normal(KEY[2], (2, 3, 4))

    def write(t, u):
        return t.at[IDS].add(u), t.at[jnp.array([7, 1, 4], jnp.int32)].set(u[0]), t.at[IDS].add(u, mode="drop")

    _, ops = imported_values(write, TABLE, updates)
    summed = ops["scatter_add"][0]
    # rows and a row's dims split; the updates' rows split into partial sums
    assert summed.nest.iterator_types == (PARALLEL, PARALLEL, REDUCTION, REDUCTION)
    assert summed.flops() == 2 * 3 * 4  # one add per updated entry
    (written,) = ops["scatter"]
    assert written.nest.iterator_types == (PARALLEL, PARALLEL, INVALID)


def test_gradients_of_lookups_are_scatter_adds():
    def loss(t, x):
        rows = jnp.take(t, IDS, axis=0)
        picked = jnp.take_along_axis(x, jax.lax.top_k(x, 2)[1], axis=-1)
        return (rows ** 2).sum() + (picked ** 2).sum()

    _, ops = imported_values(jax.grad(loss, argnums=(0, 1)), TABLE, LOGITS)
    assert len(ops["scatter_add"]) == 1 and len(ops["one_hot"]) == 2


@pytest.mark.parametrize("f, reduction, axis", [
    (lambda x: jnp.cumsum(x, axis=1), "sum", 1),
    (lambda x: jnp.cumprod(x, axis=0), "product", 0),
    (lambda x: jax.lax.cummax(x, axis=1, reverse=True), "max", 1),
    (lambda x: jax.lax.cummin(x, axis=0), "min", 0),
])
def test_running_reductions_keep_their_dim_whole(f, reduction, axis):
    _, ops = imported_values(f, LOGITS)
    (running,) = ops["cumulative"]
    assert running.attrs["reduction"] == reduction and running.flops() == LOGITS.size
    assert running.nest.iterator_types[axis] == INVALID and running.nest.iterator_types[1 - axis] == PARALLEL


@pytest.mark.parametrize("numbers, x_shape, w_shape, transposes", [
    (None, (2, 3, 9, 8), (5, 3, 3, 2), 3),  # jax's default NCHW input, OIHW filter
    (("NHWC", "HWIO", "NHWC"), (2, 9, 8, 3), (3, 2, 3, 5), 0),
    (("NWC", "WIO", "NWC"), (2, 9, 3), (3, 3, 5), 0),
])
def test_convolutions_are_channels_last_convs(numbers, x_shape, w_shape, transposes):
    x, w = jax.random.normal(KEY[3], x_shape), jax.random.normal(KEY[2], w_shape)
    rank = len(x_shape) - 2

    def conv(x, w):
        return jax.lax.conv_general_dilated(x, w, (2,) + (1,) * (rank - 1), [(1, 1)] * rank, dimension_numbers=numbers)

    graph, ops = imported_values(conv, x, w)
    (op,) = ops[f"conv{rank}d"]
    assert len(ops.get("transpose", [])) == transposes
    out = graph.tensors[op.outputs[0]].shape
    assert op.flops() == 2 * np.prod(out) * np.prod(w_shape[:-1] if numbers else w_shape[1:])
    # batch, the outputs' spatial dims and the filters split; the kernel window stays whole, C sums
    assert Counter(op.nest.iterator_types) == {PARALLEL: rank + 2, INVALID: rank, REDUCTION: 1}


def test_dilated_convolutions_are_refused_under_strict_naming_the_parameter():
    x, w = jnp.ones((1, 1, 8, 8)), jnp.ones((1, 1, 3, 3))
    with pytest.raises(InputError, match=r"rhs_dilation \(2, 2\)"):
        import_function(lambda x, w: jax.lax.conv_general_dilated(x, w, (1, 1), "SAME", rhs_dilation=(2, 2)), (x, w),
                        strict=True)


def test_splits_and_zero_padding_are_slices_and_pads():
    def f(x):
        first, second = jnp.split(x, [2], axis=1)
        # the gradient of a slice pads it back with zeros
        return first, second, jax.grad(lambda x: (x[:, 1:5] ** 2).sum())(x)

    _, ops = imported_values(f, LOGITS)
    assert sorted((op.attrs["starts"], op.attrs["limits"]) for op in ops["slice"])[:2] == [([0, 0], [6, 2]),
                                                                                          ([0, 1], [6, 5])]
    (pad,) = ops["pad"]
    assert pad.attrs == {"low": [0, 1], "high": [0, 3]}


def test_a_padding_value_other_than_zero_is_refused_under_strict_naming_why():
    with pytest.raises(InputError, match="a padding value other than a constant zero"):
        import_function(lambda x: jax.lax.pad(x, 1.0, [(1, 1, 0), (0, 0, 0)]), (LOGITS,), strict=True)


def test_entries_named_by_full_indices_are_rows_of_the_flattened_operand():
    tokens = jnp.arange(6)[:, None]

    def route(logits):
        weights, experts = jax.lax.top_k(logits, 2)
        return (jnp.zeros_like(logits).at[tokens, experts].set(weights),
                jnp.put_along_axis(jnp.zeros_like(logits), experts, weights, axis=-1, inplace=False),
                logits[tokens, experts], logits.at[tokens, experts].add(1.0),
                # out of range: dropped, as jax does; clamped in clip mode
                logits.at[jnp.array([0, 5, 6]), jnp.array([9, 7, 2])].add(3.0, mode="drop"),
                logits.at[jnp.array([0, -7, 3]), jnp.array([9, 7, -12])].get(mode="clip"))

    graph, ops = imported_values(route, LOGITS)
    assert len(ops["scatter"]) == 2 and len(ops["scatter_add"]) == 2 and len(ops["embedding"]) == 2
    for op in ops["scatter"] + ops["scatter_add"]:
        assert graph.tensors[op.outputs[0]].shape == (6 * 8,)
        assert op.nest.iterator_types[0] == PARALLEL  # the flattened entries split as rows


def test_rows_of_tables_of_any_rank_are_embeddings_of_the_flattened_rows():
    heads = jax.random.normal(KEY[2], (10, 2, 3))
    updates = jax.random.normal(KEY[3], (2, 3, 2, 3))

    def f(table, scalars):
        return table[IDS], scalars[IDS], table.at[IDS].add(updates)

    graph, ops = imported_values(f, heads, TABLE[:, 0])
    assert sorted(graph.tensors[op.inputs[1]].shape for op in ops["embedding"]) == [(10, 1), (10, 6)]
    (summed,) = ops["scatter_add"]
    assert graph.tensors[summed.outputs[0]].shape == (10, 2, 3)
