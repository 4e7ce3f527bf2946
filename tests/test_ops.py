"""Each op kind: its numpy semantics against a direct formula, its maps against its semantics.

Two checks tie the maps to the numpy semantics:
- for kinds with a scalar payload, the loop-nest interpreter (reading every operand through
  its map at every point) reproduces the op's result;
- for every kind, splitting any splittable loop into blocks and evaluating each block on the
  operand slices its maps name reassembles the full result: concatenated along a parallel
  loop, combined with the reduction kind along a reduction loop. This is exactly what a
  sharded execution relies on.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from autoshard.ops import OP_KINDS, Block, evaluate, evaluate_block
from autoshard.ops.interpret import interpret
from autoshard.ops.loops import INVALID, PARALLEL, REDUCTION
from autoshard.ops.payloads import PAYLOADS
from autoshard.ops.nn import COMBINED
from autoshard.reductions import REDUCTIONS

rng = np.random.default_rng(7)


def gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def normal_cdf(x):
    return np.vectorize(lambda v: 0.5 * math.erfc(-v / math.sqrt(2)))(x)


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def attention(q, k, v, causal, mask=None):
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if mask is not None:
        s = s + mask
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    return softmax(s) @ v


def conv_direct(x, w, stride, pad):
    """Any rank: x [N, spatial.., C], w [K.., C, F]; every output position's window, one by one."""
    rank = x.ndim - 2
    x = np.pad(x, [(0, 0)] + [tuple(p) for p in pad] + [(0, 0)])
    out_spatial = [(n - k) // s + 1 for n, k, s in zip(x.shape[1:-1], w.shape[:rank], stride)]
    out = np.zeros([x.shape[0]] + out_spatial + [w.shape[-1]])
    for at in np.ndindex(*out_spatial):
        patch = x[(slice(None),) + tuple(slice(i * s, i * s + k) for i, s, k in zip(at, stride, w.shape[:rank]))]
        out[(slice(None),) + at] = np.tensordot(patch, w, axes=(list(range(1, rank + 2)), list(range(rank + 1))))
    return out


def pool_direct(x, window, stride, pad, reduce, fill):
    x = np.pad(x, ((0, 0), tuple(pad[0]), tuple(pad[1]), (0, 0)), constant_values=fill)
    oh, ow = ((n - k) // s + 1 for n, k, s in zip(x.shape[1:3], window, stride))
    out = np.zeros((x.shape[0], oh, ow, x.shape[3]))
    for i in range(oh):
        for j in range(ow):
            out[:, i, j] = reduce(x[:, i * stride[0]:i * stride[0] + window[0], j * stride[1]:j * stride[1] + window[1]], axis=(1, 2))
    return out


def conv_nhwc(x, w, stride, pad):
    x = np.pad(x, ((0, 0), pad[0], pad[1], (0, 0)))
    kh, kw, _, f = w.shape
    oh = (x.shape[1] - kh) // stride[0] + 1
    ow = (x.shape[2] - kw) // stride[1] + 1
    out = np.zeros((x.shape[0], oh, ow, f))
    for i in range(oh):
        for j in range(ow):
            patch = x[:, i * stride[0]:i * stride[0] + kh, j * stride[1]:j * stride[1] + kw, :]
            out[:, i, j, :] = np.einsum("nhwc,hwcf->nf", patch, w)
    return out


# (kind, input shapes, attrs, direct numpy formula)
CASES = [
    ("matmul", [(3, 5, 4), (4, 6)], {}, lambda a, b: a @ b),
    ("batch_matmul", [(2, 3, 4), (2, 4, 5)], {}, lambda a, b: a @ b),
    ("dot_general", [(2, 3, 4), (4, 2, 5)], {"lhs_batch_dims": [0], "rhs_batch_dims": [1], "lhs_contracting_dims": [2],
                                             "rhs_contracting_dims": [0]}, lambda a, b: np.einsum("bmk,kbn->bmn", a, b)),
    ("add", [(4, 1, 3), (5, 3)], {}, np.add),
    ("sub", [(4, 3), (4, 3)], {}, np.subtract),
    ("mul", [(3,), (2, 3)], {}, np.multiply),
    ("div", [(2, 3), (2, 1)], {}, np.divide),
    ("max", [(2, 3), (2, 3)], {}, np.maximum),
    ("min", [(2, 3), (1, 3)], {}, np.minimum),
    ("neg", [(3, 4)], {}, np.negative),
    ("exp", [(3, 4)], {}, np.exp),
    ("tanh", [(3, 4)], {}, np.tanh),
    ("sin", [(3, 4)], {}, np.sin),
    ("cos", [(3, 4)], {}, np.cos),
    ("relu", [(3, 4)], {}, lambda x: np.maximum(x, 0)),
    ("gelu", [(3, 4)], {}, gelu),
    ("gelu_erf", [(3, 4)], {}, lambda x: x * normal_cdf(x)),
    ("erf", [(3, 4)], {}, lambda x: 2 * normal_cdf(x * math.sqrt(2)) - 1),
    ("silu", [(3, 4)], {}, lambda x: x * sigmoid(x)),
    ("sigmoid", [(3, 4)], {}, sigmoid),
    ("cast", [(3, 4)], {"dtype": "f16"}, lambda x: x.astype(np.float16)),
    ("compare", [(2, 3), (1, 3)], {"direction": "lt"}, np.less),
    ("compare", [(4,), ()], {"direction": "ge"}, np.greater_equal),
    ("select", [(2, 3), (2, 3), (3,)], {}, lambda which, a, b: np.where(which, b, a)),
    ("iota", [], {"shape": [3, 4], "dimension": 1, "dtype": "i32"}, lambda: np.broadcast_to(np.arange(4), (3, 4))),
    ("reduce_sum", [(3, 4, 5)], {"dims": [1]}, lambda x: x.sum(1)),
    ("reduce_max", [(3, 4, 5)], {"dims": [0, 2], "keepdims": True}, lambda x: x.max((0, 2), keepdims=True)),
    ("reduce_min", [(3, 4)], {"dims": [-1]}, lambda x: x.min(-1)),
    ("reduce_mean", [(3, 4, 5)], {"dims": [2]}, lambda x: x.mean(2)),
    ("softmax", [(3, 6)], {}, softmax),
    ("softmax", [(4, 3)], {"axis": 0}, lambda x: softmax(x, 0)),
    ("layer_norm", [(3, 8), (8,), (8,)], {"eps": 1e-5},
     lambda x, g, b: (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5) * g + b),
    ("rms_norm", [(3, 8), (8,)], {}, lambda x, g: x / np.sqrt((x ** 2).mean(-1, keepdims=True) + 1e-6) * g),
    ("transpose", [(2, 3, 4)], {"perm": [2, 0, 1]}, lambda x: x.transpose(2, 0, 1)),
    ("reshape", [(2, 12)], {"shape": [2, 3, 4]}, lambda x: x.reshape(2, 3, 4)),
    ("reshape", [(4, 3, 2)], {"shape": [12, 2]}, lambda x: x.reshape(12, 2)),
    ("broadcast_in_dim", [(3,)], {"shape": [2, 3, 4], "broadcast_dimensions": [1]},
     lambda x: np.broadcast_to(x[None, :, None], (2, 3, 4))),
    ("concat", [(2, 3), (2, 5)], {"axis": 1}, lambda a, b: np.concatenate([a, b], 1)),
    ("slice", [(6, 5)], {"starts": [1, 0], "limits": [6, 5], "strides": [2, 1]}, lambda x: x[1:6:2, :]),
    ("embedding", [(2, 3), (7, 4)], {}, lambda ids, t: t[ids]),
    ("cumulative", [(3, 5)], {"axis": 1, "reduction": "sum"}, lambda x: np.cumsum(x, 1)),
    ("cumulative", [(4, 3)], {"axis": 0, "reduction": "max", "reverse": True},
     lambda x: np.flip(np.maximum.accumulate(np.flip(x, 0), 0), 0)),
    ("scatter_add", [(2, 3), (2, 3, 4)], {"rows": 7}, lambda ids, u: np.eye(7)[ids].reshape(6, 7).T @ u.reshape(6, 4)),
    ("scatter", [(7, 4), (5,), (5, 4)], {}, lambda x, ids, u: written(x, ids, u)),
    ("top_k_values", [(3, 4, 6)], {"k": 2}, lambda x: -np.sort(-x, axis=-1)[..., :2]),
    ("top_k_indices", [(3, 6)], {"k": 3}, lambda x: np.argsort(-x, axis=-1)[..., :3]),
    ("one_hot", [(2, 3)], {"num_classes": 5, "dtype": "f32"}, lambda ids: np.eye(5, dtype=np.float32)[ids]),
    ("attention", [(1, 2, 4, 3), (1, 2, 5, 3), (1, 2, 5, 2)], {}, lambda q, k, v: attention(q, k, v, False)),
    ("attention", [(1, 2, 4, 3), (1, 2, 4, 3), (1, 2, 4, 2)], {"causal": True}, lambda q, k, v: attention(q, k, v, True)),
    ("pad", [(3, 4)], {"low": [1, 0], "high": [2, 0]}, lambda x: np.pad(x, ((1, 2), (0, 0)))),
    # an additive mask broadcast over the batch and the heads
    ("attention", [(2, 2, 4, 3), (2, 2, 5, 3), (2, 2, 5, 2), (1, 1, 4, 5)], {},
     lambda q, k, v, m: attention(q, k, v, False, m)),
    ("conv2d", [(2, 5, 6, 3), (3, 2, 3, 4)], {"strides": [2, 1], "padding": [[1, 1], [0, 1]]},
     lambda x, w: conv_nhwc(x, w, (2, 1), ((1, 1), (0, 1)))),
    ("conv1d", [(2, 9, 3), (3, 3, 2)], {"strides": [1], "padding": [[1, 1]]},
     lambda x, w: conv_direct(x, w, (1,), ((1, 1),))),
    ("conv3d", [(1, 4, 5, 6, 2), (3, 2, 3, 2, 3)], {"strides": [1, 2, 1], "padding": [[1, 1], [0, 1], [2, 0]]},
     lambda x, w: conv_direct(x, w, (1, 2, 1), ((1, 1), (0, 1), (2, 0)))),
    ("max_pool2d", [(2, 7, 6, 3)], {"window": [3, 3], "strides": [2, 1], "padding": [[1, 1], [1, 1]]},
     lambda x: pool_direct(x, (3, 3), (2, 1), ((1, 1), (1, 1)), np.max, -np.inf)),
    ("avg_pool2d", [(2, 8, 6, 3)], {"window": [2, 3], "padding": [[0, 0], [1, 1]]},
     lambda x: pool_direct(x, (2, 3), (2, 3), ((0, 0), (1, 1)), np.mean, 0.0)),
    ("reverse", [(3, 4, 2)], {"dims": [0, -1]}, lambda x: x[::-1, :, ::-1]),
    ("generic", [(3, 4)], {"iterator_types": ["parallel", "reduction"], "indexing_maps": ["(d0, d1) -> (d0, d1)", "(d0, d1) -> (d0)"],
                           "payload": "add"}, lambda x: x.sum(1)),
    ("generic", [(3, 4), (4, 5)], {"iterator_types": ["parallel", "parallel", "reduction_max"],
                                   "indexing_maps": ["(d0, d1, d2) -> (d0, d2)", "(d0, d1, d2) -> (d2, d1)", "(d0, d1, d2) -> (d0, d1)"],
                                   "payload": "add"}, lambda a, b: (a[:, :, None] + b[None]).max(1)),
    ("generic", [(6,)], {"iterator_types": ["parallel", "parallel"], "indexing_maps": ["(d0, d1) -> (d0 * 3 + d1)", "(d0, d1) -> (d1, d0)"],
                         "payload": "exp"}, lambda x: np.exp(x.reshape(2, 3).T)),
]
# generic ops also read their declared output shape to fix loop extents
OUTPUT_SHAPES = {id(CASES[-1]): [(3, 2)], id(CASES[-2]): [(3, 5)], id(CASES[-3]): [(3,)]}


def written(x, ids, updates):
    out = x.copy()
    out[ids] = updates
    return out


def nest_of(case):
    kind_name, shapes, attrs, _ = case
    kind = OP_KINDS[kind_name]
    return kind.loops(list(shapes) + OUTPUT_SHAPES.get(id(case), []), attrs)


def make_inputs(kind: str, shapes):
    if kind == "embedding":
        return [rng.integers(0, shapes[1][0], shapes[0]), rng.uniform(-1, 1, shapes[1])]
    if kind == "one_hot":
        return [rng.integers(0, 5, shapes[0])]
    if kind == "scatter_add":
        return [rng.integers(0, 7, shapes[0]), rng.uniform(-1, 1, shapes[1])]
    if kind == "scatter":  # distinct ids: which of two writes to one row wins is the last's
        return [rng.uniform(-1, 1, shapes[0]), rng.permutation(shapes[0][0])[:shapes[1][0]], rng.uniform(-1, 1, shapes[2])]
    if kind == "select":
        return [rng.integers(0, 2, shapes[0]).astype(bool)] + [rng.uniform(-1, 1, s) for s in shapes[1:]]
    if kind == "div":
        return [rng.uniform(-1, 1, shapes[0]), rng.uniform(0.5, 2, shapes[1])]
    return [rng.uniform(-1, 1, s) for s in shapes]


def ids(case):
    return f"{case[0]}-{'x'.join(str(len(s)) for s in case[1])}-{sorted(case[2])}"


@pytest.mark.parametrize("case", CASES, ids=[ids(c) for c in CASES])
def test_numpy_semantics_match_direct_formula(case):
    kind_name, shapes, attrs, formula = case
    kind = OP_KINDS[kind_name]
    nest = nest_of(case)
    inputs = make_inputs(kind_name, shapes)
    (result,) = evaluate(kind, nest, attrs, inputs)
    expected = formula(*inputs)
    assert result.shape == nest.output_shapes()[0] == expected.shape
    np.testing.assert_allclose(result, expected, rtol=1e-3 if kind_name == "cast" else 1e-6, atol=1e-6)


PAYLOAD_CASES = [c for c in CASES if (OP_KINDS[c[0]].payload or c[0] == "generic") and c[0] != "reduce_mean"]


@pytest.mark.parametrize("case", PAYLOAD_CASES, ids=[ids(c) for c in PAYLOAD_CASES])
def test_maps_read_every_element_the_payload_uses(case):
    """Interpreting the maps point by point with the payload equals the op's numpy result."""
    kind_name, shapes, attrs, _ = case
    kind = OP_KINDS[kind_name]
    nest = nest_of(case)
    inputs = make_inputs(kind_name, shapes)
    (expected,) = evaluate(kind, nest, attrs, inputs)
    payload = PAYLOADS[attrs["payload"] if kind_name == "generic" else kind.payload]
    combiner = payload.arity == len(inputs) + 1 and bool(nest.reduction_loops)
    result = interpret(nest, payload, inputs, Block.whole(nest.extents), [(0,) * x.ndim for x in inputs], combiner)
    np.testing.assert_allclose(result, expected.astype(result.dtype), rtol=1e-3, atol=1e-6)


def split_blocks(nest, loop):
    extent = nest.extents[loop]
    cut = max(1, extent // 2)
    for start, size in ((0, cut), (cut, extent - cut)):
        starts = tuple(start if l == loop else 0 for l in range(nest.num_loops))
        sizes = tuple(size if l == loop else e for l, e in enumerate(nest.extents))
        yield Block(starts, sizes, nest.extents)


def evaluate_split(kind, nest, attrs, inputs, loop):
    """Evaluate block by block along `loop` and reassemble per its iterator type."""
    (full,) = evaluate(kind, nest, attrs, inputs)
    out = None
    for block in split_blocks(nest, loop):
        cut = [x[nest.operand_range(m, block, x.shape)] for x, m in zip(inputs, nest.input_maps)]
        (part,) = evaluate_block(kind, nest, attrs, cut, block)
        if nest.iterator_types[loop] == REDUCTION:
            out = part if out is None else REDUCTIONS[nest.reduction_kind].pairwise(out, part)
        else:
            region = nest.operand_range(nest.output_maps[0], block, full.shape)
            out = np.zeros_like(full) if out is None else out
            out[region] = part
    return full, out


@pytest.mark.parametrize("case", CASES, ids=[ids(c) for c in CASES])
def test_split_loops_reassemble_the_result(case):
    kind_name, shapes, attrs, _ = case
    kind = OP_KINDS[kind_name]
    nest = nest_of(case)
    inputs = make_inputs(kind_name, shapes)
    splittable = nest.splittable_loops()
    assert splittable, "every kind has at least one loop that can be split"
    for loop in splittable:
        if nest.extents[loop] < 2 or nest.iterator_types[loop] == COMBINED:
            continue  # a combined loop's blocks meet in the op's own collectives: tests/test_context_parallel.py
        full, reassembled = evaluate_split(kind, nest, attrs, inputs, loop)
        np.testing.assert_allclose(reassembled, full, rtol=1e-5, atol=1e-6, err_msg=f"loop d{loop}")


@pytest.mark.parametrize("kind_name, shapes, attrs, loop", [
    ("softmax", [(3, 6)], {}, 1),
    ("layer_norm", [(3, 8)], {}, 1),
    ("rms_norm", [(3, 8)], {}, 1),
    ("top_k_values", [(3, 6)], {"k": 2}, 2),  # the row the k largest are picked from
    ("cumulative", [(3, 6)], {"axis": 1, "reduction": "sum"}, 1),  # the running dim
    ("scatter", [(7, 4), (5,), (5, 4)], {}, 2),  # the ids: a later write must win
    ("attention", [(1, 2, 4, 3), (1, 2, 6, 3), (1, 2, 6, 2)], {}, 4),  # keys: combined, never a plain sum
    ("attention", [(1, 2, 4, 4), (1, 2, 6, 4), (1, 2, 6, 2)], {}, 5),  # query features
])
def test_invalid_loops_are_the_ones_a_split_would_break(kind_name, shapes, attrs, loop):
    """The loops marked invalid (or combined, split only through the op's own combine) really
    change the result when split as a parallel or reduction loop."""
    kind = OP_KINDS[kind_name]
    nest = kind.loops(shapes, attrs)
    assert nest.iterator_types[loop] in (INVALID, COMBINED)
    inputs = make_inputs(kind_name, shapes)
    # A loop indexing the result could only be a parallel split; one that does not, a reduction.
    indexes_result = any(loop in e.loops for e in nest.output_maps[0].results)
    types = list(nest.iterator_types)
    types[loop] = PARALLEL if indexes_result else REDUCTION
    pretend = type(nest)(nest.extents, tuple(types), nest.input_maps, nest.output_maps, nest.reduction_kind)
    full, reassembled = evaluate_split(kind, pretend, attrs, inputs, loop)
    assert not np.allclose(reassembled, full), f"splitting d{loop} should break {kind_name}"


def test_every_registered_kind_has_a_test_case():
    tested = {c[0] for c in CASES}
    # elementwise kinds and `opaque` below; `grad` rows are covered by tests/test_grad_row.py
    untested = set(OP_KINDS) - tested - {"abs", "log", "sqrt", "rsqrt", "square", "pow", "grad", "opaque"}
    assert not untested, f"add a case for {sorted(untested)}"


@pytest.mark.parametrize("name", ["abs", "log", "sqrt", "rsqrt", "square", "pow"])
def test_remaining_elementwise_kinds(name):
    kind = OP_KINDS[name]
    shapes = [(3, 4)] * PAYLOADS[name].arity
    nest = kind.loops(shapes, {})
    inputs = [rng.uniform(0.5, 2, s) for s in shapes]
    direct = {"abs": np.abs, "log": np.log, "sqrt": np.sqrt, "rsqrt": lambda x: x ** -0.5, "square": np.square,
              "pow": np.power}[name]
    np.testing.assert_allclose(evaluate(kind, nest, {}, inputs)[0], direct(*inputs))


def test_flops_of_a_matmul_are_two_per_multiply_add():
    nest = OP_KINDS["matmul"].loops([(8, 16), (16, 32)], {})
    assert OP_KINDS["matmul"].flops(nest, {}) == 2 * 8 * 16 * 32


def test_reshape_that_is_not_split_or_merge_is_refused():
    from autoshard.ops import OpError
    with pytest.raises(OpError, match="not a split/merge"):
        OP_KINDS["reshape"].loops([(6, 4)], {"shape": [4, 6]})


def test_an_opaque_op_is_never_split_and_has_its_declared_result():
    kind = OP_KINDS["opaque"]
    attrs = {"shape": [5], "dtype": "i32", "primitive": "cumsum"}
    nest = kind.loops([(2, 3), (4,)], attrs)
    assert nest.splittable_loops() == () and set(nest.iterator_types) == {INVALID}
    assert [str(m) for m in nest.maps] == ["(d0, d1, d2, d3) -> (d1, d2)", "(d0, d1, d2, d3) -> (d3)",
                                           "(d0, d1, d2, d3) -> (d0)"]
    (result,) = evaluate(kind, nest, attrs, [rng.uniform(-1, 1, (2, 3)), rng.uniform(-1, 1, (4,))])
    assert result.dtype == np.int32 and result.shape == (5,)
