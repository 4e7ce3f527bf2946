"""Causal attention is priced by the (query, key) pairs its mask keeps, forward and backward."""

from __future__ import annotations

import numpy as np
import pytest

from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.models import GraphBuilder
from autoshard.ops import OP_KINDS
from autoshard.ops.grads import GRAD_RULES
from autoshard.ops.nn import causal_pairs
from autoshard.planning.costs import device_flops
from autoshard.planning.options import ShardingOption

SHAPES = [(2, 4, 64, 16), (2, 4, 64, 16), (2, 4, 64, 8)]  # q [B, H, S, D], k [B, H, T, D], v [B, H, T, E]


def test_causal_pairs_count_the_lower_triangle_with_its_diagonal():
    for queries, keys in ((64, 64), (5, 9), (9, 5), (1, 1)):
        mask = np.tril(np.ones((queries, keys), dtype=bool))
        assert causal_pairs(queries, keys) == mask.sum()
        # contiguous query blocks add up to the whole, the last doing the most work; key blocks too
        assert causal_pairs(3, keys, 0) + causal_pairs(queries - 3, keys, 3) == mask.sum()
        assert causal_pairs(queries, 2, 0, 0) + causal_pairs(queries, keys - 2, 0, 2) == mask.sum()


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


def test_a_contiguous_query_split_is_priced_at_its_busiest_block_forward_and_backward():
    b = GraphBuilder("causal", "f32")
    q, k, v = (b.input(n, s) for n, s in zip("qkv", SHAPES))
    b.mark_outputs(b.op("attention", [q, k, v], "sdpa", causal=True), b.op("attention", [q, k, v], "full"))
    graph = graph_from_json(b.document())
    causal, full = graph.op_by_name["sdpa"], graph.op_by_name["full"]
    mesh = Mesh.parse("dp=2,cp=4")
    queries = ShardingOption(((), (), ("cp",), (), (), ()))
    # the last of 4 query blocks sees the most keys: rows 48..63
    last_block = causal_pairs(16, 64, 48) / causal_pairs(64, 64)
    assert device_flops(causal, queries, mesh) == pytest.approx(causal.flops() * last_block)
    assert device_flops(full, queries, mesh) == full.flops() / 4
    batch_and_queries = ShardingOption((("dp",), (), ("cp",), (), (), ()))
    assert device_flops(causal, batch_and_queries, mesh) == pytest.approx(device_flops(causal, queries, mesh) / 2)
    # a gradient's work lies over the forward's loops as the forward's does
    grad = {"of": "attention", "wrt": 1, "forward": {"causal": True}}
    splits = (1, 1, 4, 1, 1, 1)
    assert OP_KINDS["grad"].block_share(causal.nest, grad, splits) == OP_KINDS["attention"].block_share(
        causal.nest, {"causal": True}, splits)
