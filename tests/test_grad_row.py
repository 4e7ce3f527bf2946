"""The `grad` row: gradients against finite differences of the forward op, and every loop a
split may cut reassembles the whole gradient (concatenated if parallel, summed if reduction)."""

from __future__ import annotations

import numpy as np
import pytest

from autoshard.graph.schema import graph_from_json
from autoshard.ops import OP_KINDS, Block, OpError, evaluate, evaluate_block
from autoshard.ops.grads import GRAD_RULES, SLOPES
from autoshard.ops.loops import INVALID, PARALLEL, REDUCTION
from autoshard.ops.payloads import UNARY
from autoshard.ops.nn import KEY_LOOP

POSITIVE = {"log", "sqrt", "rsqrt", "pow"}

# (forward kind, forward input shapes, forward attrs, wrt)
CASES = [(name, [(3, 4)], {}, 0) for name in sorted(SLOPES)] + [
    ("reduce_mean", [(3, 4, 5)], {"dims": [1]}, 0),
    ("reduce_mean", [(3, 4, 5)], {"dims": [0, 2], "keepdims": True}, 0),
    *[("layer_norm", [(3, 8), (8,), (8,)], {"eps": 1e-5}, wrt) for wrt in (0, 1, 2)],
    ("layer_norm", [(6, 3), (6,)], {"axis": 0}, 0),
    ("layer_norm", [(3, 8)], {}, 0),
    *[("rms_norm", [(2, 3, 8), (8,)], {}, wrt) for wrt in (0, 1)],
    *[("attention", [(1, 2, 4, 3), (1, 2, 5, 3), (1, 2, 5, 2)], {}, wrt) for wrt in (0, 1, 2)],
    *[("attention", [(2, 1, 4, 3), (2, 1, 4, 3), (2, 1, 4, 2)], {"causal": True, "scale": 0.7}, wrt) for wrt in (0, 1, 2)],
    ("pow", [(3, 4), ()], {}, 0),
    ("pow", [(1, 4), (3, 4)], {}, 0),  # a base broadcast along a dim: its gradient sums that dim
    ("embedding", [(2, 3), (7, 4)], {}, 1),
    ("top_k_values", [(3, 6)], {"k": 2}, 0),
    ("top_k_values", [(2, 3, 5)], {"k": 5}, 0),
    # an additive mask broadcast over batch and heads
    *[("attention", [(2, 2, 4, 3), (2, 2, 5, 3), (2, 2, 5, 2), (1, 1, 4, 5)], {}, wrt) for wrt in (0, 1, 2)],
    # filters through padded and strided windows; the spatial loops sum with halos on the input
    ("conv2d", [(2, 6, 5, 3), (3, 2, 3, 4)], {"strides": [2, 1], "padding": [[1, 1], [0, 1]]}, 1),
    ("conv1d", [(2, 7, 2), (3, 2, 3)], {"padding": [[1, 1]]}, 1),
    ("conv3d", [(1, 4, 3, 4, 2), (3, 1, 3, 2, 2)], {"padding": [[1, 1], [0, 0], [1, 1]]}, 1),
    ("max_pool2d", [(2, 4, 6, 3)], {"window": [2, 2]}, 0),
    ("avg_pool2d", [(2, 6, 4, 3)], {"window": [3, 2]}, 0),
]


def ids(case):
    return f"{case[0]}-wrt{case[3]}-{sorted(case[2])}"


def forward_inputs(case, rng):
    kind, shapes, _, _ = case
    if kind == "embedding":
        return [rng.integers(0, shapes[1][0], shapes[0]), rng.uniform(-1, 1, shapes[1])]
    low = 0.5 if kind in POSITIVE else -1.0
    # keep |x| away from 0 so relu and abs are differentiable at every point
    return [np.where(rng.random(s) < 0.5, -1, 1) * rng.uniform(0.2, 1, s) if low < 0 else rng.uniform(low, 2, s)
            for s in shapes]


def grad_attrs(case):
    kind, _, attrs, wrt = case
    return {"of": kind, "wrt": wrt, "forward": attrs}


def grad_nest(case, inputs, dy):
    return OP_KINDS["grad"].loops([x.shape for x in inputs] + [dy.shape], grad_attrs(case))


@pytest.mark.parametrize("case", CASES, ids=[ids(c) for c in CASES])
def test_gradient_matches_finite_differences(case):
    rng = np.random.default_rng(3)
    kind_name, _, attrs, wrt = case
    kind = OP_KINDS[kind_name]
    inputs = forward_inputs(case, rng)
    fwd = kind.loops([x.shape for x in inputs], attrs)
    dy = rng.uniform(-1, 1, fwd.output_shapes()[0])

    def loss(x):
        args = list(inputs)
        args[wrt] = x
        return float(np.sum(evaluate(kind, fwd, attrs, args)[0] * dy))

    (grad,) = evaluate(OP_KINDS["grad"], grad_nest(case, inputs, dy), grad_attrs(case), inputs + [dy])
    x = inputs[wrt]
    numeric = np.zeros_like(x)
    step = 1e-6
    for index in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[index] += step
        down[index] -= step
        numeric[index] = (loss(up) - loss(down)) / (2 * step)
    assert grad.shape == x.shape
    np.testing.assert_allclose(grad, numeric, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("case", CASES, ids=[ids(c) for c in CASES])
def test_split_loops_reassemble_the_gradient(case):
    rng = np.random.default_rng(4)
    kind = OP_KINDS[case[0]]
    inputs = forward_inputs(case, rng)
    dy = rng.uniform(-1, 1, kind.loops([x.shape for x in inputs], case[2]).output_shapes()[0])
    operands = inputs + [dy]
    nest = grad_nest(case, inputs, dy)
    grad_kind, attrs = OP_KINDS["grad"], grad_attrs(case)
    (full,) = evaluate(grad_kind, nest, attrs, operands)
    splittable = [l for l in nest.splittable_loops() if nest.extents[l] > 1]
    assert splittable
    for loop in splittable:
        if case[0] == "attention" and loop == KEY_LOOP:
            continue  # key blocks need every key's row statistics first: tests/test_context_parallel.py
        cut = nest.extents[loop] // 2
        out = np.zeros_like(full)
        for start, size in ((0, cut), (cut, nest.extents[loop] - cut)):
            block = Block(tuple(start if l == loop else 0 for l in range(nest.num_loops)),
                          tuple(size if l == loop else e for l, e in enumerate(nest.extents)), nest.extents)
            local = [x[nest.operand_range(m, block, x.shape)] for x, m in zip(operands, nest.input_maps)]
            (part,) = evaluate_block(grad_kind, nest, attrs, local, block)
            if nest.iterator_types[loop] == REDUCTION:
                out += part
            else:
                out[nest.operand_range(nest.output_maps[0], block, full.shape)] = part
        np.testing.assert_allclose(out, full, rtol=1e-6, atol=1e-9, err_msg=f"loop d{loop}")


def test_loops_indexing_the_differentiated_input_stay_parallel_the_others_sum():
    # matmul-free example: the gamma gradient of a layer norm sums over the rows
    nest = OP_KINDS["grad"].loops([(4, 6, 8), (8,), (8,), (4, 6, 8)], {"of": "layer_norm", "wrt": 1})
    assert nest.iterator_types == (REDUCTION, REDUCTION, INVALID)
    assert nest.output_shapes() == ((8,),)
    # attention: dq splits batch, heads, queries; the value features and the keys are summed (a key
    # split after the op's combine of row statistics); the query features stay whole
    nest = OP_KINDS["grad"].loops([(1, 2, 4, 3), (1, 2, 5, 3), (1, 2, 5, 2), (1, 2, 4, 2)], {"of": "attention", "wrt": 0})
    assert nest.iterator_types == (PARALLEL, PARALLEL, PARALLEL, REDUCTION, REDUCTION, INVALID)
    # embedding: the table gradient splits vocabulary and features, sums over the ids
    nest = OP_KINDS["grad"].loops([(2, 3), (7, 4), (2, 3, 4)], {"of": "embedding", "wrt": 1})
    assert nest.iterator_types == (REDUCTION, REDUCTION, PARALLEL, PARALLEL)


def test_every_unary_payload_has_a_slope():
    assert set(SLOPES) == set(UNARY)
    assert {"attention", "layer_norm", "rms_norm", "embedding", "reduce_mean"} <= set(GRAD_RULES)


@pytest.mark.parametrize("attrs, shapes, field", [
    ({"of": "matmul", "wrt": 0}, [(2, 3), (3, 4), (2, 4)], "of"),
    ({"of": "embedding", "wrt": 0}, [(2, 3), (7, 4), (2, 3, 4)], "wrt"),
    ({"of": "gelu", "wrt": 0, "forward": {"axis": 1}}, [(2, 3), (2, 3)], "forward"),
    ({"of": "gelu", "wrt": 0}, [(2, 3), (3, 2)], ""),
])
def test_bad_grad_ops_name_the_attribute(attrs, shapes, field):
    with pytest.raises(OpError) as error:
        OP_KINDS["grad"].loops(shapes, attrs)
    assert error.value.field == field


def test_a_graph_with_grad_ops_validates_and_keeps_the_input_dtype():
    doc = {"format": "autoshard.graph/v1",
           "tensors": {"x": {"shape": [4, 8], "dtype": "bf16", "role": "input"},
                       "dy": {"shape": [4, 8], "dtype": "bf16", "role": "input"},
                       "dx": {"shape": [4, 8], "dtype": "bf16"}},
           "ops": [{"name": "g", "kind": "grad", "inputs": ["x", "dy"], "outputs": ["dx"], "of": "gelu", "wrt": 0}]}
    graph = graph_from_json(doc)
    assert graph.ops[0].nest.iterator_types == (PARALLEL, PARALLEL)
    assert graph.ops[0].flops() == (8 + 1) * 32
