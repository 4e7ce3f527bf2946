"""Causal attention is priced by the (query, key) pairs its mask keeps, forward and backward."""

from __future__ import annotations

import numpy as np
import pytest

from autoshard.ops import OP_KINDS
from autoshard.ops.grads import GRAD_RULES
from autoshard.ops.nn import causal_pairs

SHAPES = [(2, 4, 64, 16), (2, 4, 64, 16), (2, 4, 64, 8)]  # q [B, H, S, D], k [B, H, T, D], v [B, H, T, E]


def test_causal_pairs_count_the_lower_triangle_with_its_diagonal():
    for queries, keys in ((64, 64), (5, 9), (9, 5), (1, 1)):
        mask = np.tril(np.ones((queries, keys), dtype=bool))
        assert causal_pairs(queries, keys) == mask.sum()
        # contiguous query blocks add up to the whole, the last doing the most work
        assert causal_pairs(3, keys, 0) + causal_pairs(queries - 3, keys, 3) == mask.sum()


def test_causal_attention_costs_half_the_square_plus_the_diagonal():
    kind = OP_KINDS["attention"]
    nest = kind.loops(SHAPES, {"causal": True})
    full, causal = kind.flops(nest, {}), kind.flops(nest, {"causal": True})
    assert causal == pytest.approx(full * (64 * 65 / 2) / (64 * 64))
    assert full == 2 * 2 * 4 * 64 * 64 * (16 + 8) + 5 * 2 * 4 * 64 * 64  # every pair without the mask
    rule = GRAD_RULES["attention"]
    for wrt in (0, 1, 2, 3):
        assert rule.flops(nest, {"causal": True}, wrt) == pytest.approx(rule.flops(nest, {}, wrt) * 65 / 128)


def test_the_last_of_n_contiguous_query_blocks_sees_2n_minus_1_times_the_first_ones_keys():
    n, block = 4, 1024
    first, last = causal_pairs(block, n * block, 0), causal_pairs(block, n * block, (n - 1) * block)
    assert last / first == pytest.approx(2 * n - 1, rel=1e-3)
