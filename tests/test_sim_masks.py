"""An input an attention's bool mask is moved from (an imported program's opaque mask, a padding
mask argument) is drawn as a valid mask: random, but keeping every row's first key. Drawn like any
bool, a row masked everywhere makes the reference's softmax 0 / 0, and every device's same NaN
would pass a check that compared nothing."""

from __future__ import annotations

import math

import numpy as np
import pytest

import autoshard
from autoshard.graph.evaluate import evaluate_graph, random_inputs
from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.planning.plan import Plan
from autoshard.sim.program import verify_plan

B, H, S, D = 2, 2, 8, 4


def masked_attention(mask: dict, moves: list[dict], causal: bool = False) -> dict:
    """Attention over q, k, v [B, H, S, D] whose bool mask is the input `mask` moved by `moves`
    (ops reading the previous value, the first one the input; the last one's value is the mask)."""
    tensors = {n: {"shape": [B, H, S, D], "dtype": "f32", "role": "input"} for n in ("q", "k", "v")}
    tensors["mask"] = {**mask, "role": "input"}
    ops, value = [], "mask"
    for i, move in enumerate(moves):
        out = f"m{i}"
        tensors[out] = {"shape": move.pop("shape_out"), "dtype": move.pop("dtype_out", "bool")}
        ops.append({"name": f"move{i}", "inputs": [value], "outputs": [out], **move})
        value = out
    tensors["out"] = {"shape": [B, H, S, D], "dtype": "f32"}
    ops.append({"name": "attend", "kind": "attention", "inputs": ["q", "k", "v", value], "outputs": ["out"],
                "causal": causal})
    return {"format": "autoshard.graph/v1", "name": "masked", "tensors": tensors, "ops": ops, "outputs": ["out"]}


def query_mask() -> dict:
    """A mask of the query rows [1, 1, S, 1] broadcast over the keys (BERT's and ViT's as
    transformers writes it): a single false masks a whole row."""
    return masked_attention({"shape": [1, 1, S, 1], "dtype": "bool"},
                            [{"kind": "broadcast_in_dim", "shape": [B, 1, S, S], "broadcast_dimensions": [0, 1, 2, 3],
                              "shape_out": [B, 1, S, S]}])


def padding_mask(causal: bool = False) -> dict:
    """An integer padding mask [B, S] of the keys, made bool and reshaped to [B, 1, 1, S]."""
    return masked_attention({"shape": [B, S], "dtype": "i64"},
                            [{"kind": "cast", "dtype": "bool", "shape_out": [B, S]},
                             {"kind": "reshape", "shape": [B, 1, 1, S], "shape_out": [B, 1, 1, S]}], causal)


def test_a_mask_of_the_query_rows_is_drawn_keeping_every_row():
    graph = graph_from_json(query_mask())
    for seed in range(4):
        inputs = random_inputs(graph, seed)
        assert inputs["mask"].all()  # each row has one element, its only key
        assert np.isfinite(evaluate_graph(graph, inputs)["out"]).all()


@pytest.mark.parametrize("causal", [False, True])
def test_a_padding_mask_keeps_the_first_key_and_stays_random_elsewhere(causal: bool):
    graph = graph_from_json(padding_mask(causal))
    for seed in range(8):
        inputs = random_inputs(graph, seed)
        mask = inputs["mask"]
        assert mask.dtype == np.int64 and (mask[:, 0] != 0).all()
        assert (mask[:, 1:] == 0).any() and (mask[:, 1:] != 0).any()  # the other keys drawn as any integer
        assert np.isfinite(evaluate_graph(graph, inputs)["out"]).all()


def test_the_other_inputs_are_drawn_as_before():
    graph = graph_from_json(padding_mask())
    rng = np.random.default_rng(0)
    for name in ("q", "k", "v"):  # drawn in the graph's order, the mask's repair drawing nothing
        np.testing.assert_array_equal(random_inputs(graph, seed=0)[name],
                                      rng.uniform(-1.0, 1.0, (B, H, S, D)).astype(np.float32))


def plan_of(document: dict) -> Plan:
    mesh = Mesh.parse("x=2")
    hardware = autoshard.bind_hardware("dgx-h100", mesh)
    settings = autoshard.SolveSettings(deterministic=True)
    return autoshard.make_plan(graph_from_json(document), mesh, hardware, settings).plan


@pytest.mark.parametrize("document", [query_mask(), padding_mask(causal=True)], ids=["query rows", "padding"])
def test_a_plan_of_a_masked_attention_is_checked_against_finite_values(document: dict):
    plan = plan_of(document)
    with np.errstate(invalid="raise"):  # no 0 / 0 in any row's softmax
        verdict = verify_plan(plan)
    assert verdict.passed and verdict.values_checked > 0 and math.isfinite(verdict.max_error), verdict.summary()


def test_a_mask_the_graph_carries_is_the_programs_own_and_a_row_it_masks_everywhere_fails_the_check():
    document = query_mask()
    carried = [True] * (S - 1) + [False]  # the program itself masks its last query row everywhere
    document["tensors"]["mask"]["value"] = carried
    plan = plan_of(document)
    np.testing.assert_array_equal(random_inputs(plan.graph)["mask"].ravel(), carried)
    with np.errstate(invalid="ignore"):
        verdict = verify_plan(plan)
    assert not verdict.passed and verdict.first_divergence is not None
    assert "the reference is NaN at" in verdict.first_divergence.message
