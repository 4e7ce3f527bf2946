"""`--recompute routed`: a layer with routed experts runs its forward again for the backward, as
`full` does, but keeps the tokens dispatched to the experts and the experts' outputs, so the
recomputed experts read them where they are and an expert-parallel plan runs no all-to-all
again; a layer without routed experts is left as it is."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autoshard.graph.model import Graph, live_ranges, topological_order
from autoshard.graph.recompute import PREFIX, with_recomputation
from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.models import GPTConfig, MoEConfig, gpt, moe
from autoshard.models.llama_layout import llama_constraints
from autoshard.planning.hardware import bind_hardware
from autoshard.planning.make_plan import SolveSettings, make_plan

SMALL = GPTConfig(layers=2, hidden=32, heads=4, kv_heads=2, seq=16, batch=4, vocab=64, style="llama", moe_experts=4,
                  moe_top_k=2, moe_ffn=48, moe_group_size=8)
# dispatched tokens of MiBs a device, where an all-to-all beats gathering them
LARGE = replace(SMALL, hidden=4096, seq=256, batch=8, moe_group_size=64)
KEPT = ("mlp.dispatch_tokens", "mlp.experts.down")


def copies(graph: Graph, layer: int) -> set[str]:
    return {op.name.removeprefix(f"{PREFIX}layer{layer}.") for op in graph.ops
            if op.name.startswith(f"{PREFIX}layer{layer}.")}


@pytest.fixture(scope="module")
def steps() -> dict[str, Graph]:
    graph = graph_from_json(gpt(SMALL, training=True))
    return {mode: with_recomputation(graph, mode) for mode in ("full", "routed")}


def test_the_experts_run_again_from_the_kept_dispatched_tokens(steps):
    routed, full = steps["routed"], steps["full"]
    for layer in range(SMALL.layers):
        made = copies(routed, layer)
        # attention and the router run again as in full; the experts too, but neither the dispatch nor the
        # experts' last contraction, whose values are kept, nor what the backward does not read
        assert {name for name in copies(full, layer) if not name.startswith("mlp")} <= made
        assert {"mlp.router", "mlp.gates", "mlp.combine_weights", "mlp.experts.gate", "mlp.experts.up",
                "mlp.experts.silu", "mlp.experts.glu"} <= made
        assert made.isdisjoint(KEPT + ("mlp.combine", "mlp.routed", "mlp_residual"))
        assert set(KEPT) <= copies(full, layer)
        p = f"layer{layer}.mlp"
        ops = routed.op_by_name
        assert ops[f"{PREFIX}{p}.experts.gate"].inputs[0] == f"{p}.dispatch_tokens"
        assert ops[f"{PREFIX}{p}.experts.up"].inputs[0] == f"{p}.dispatch_tokens"
        # the combine's backward reads the experts' outputs as the forward made them
        readers = [op for op in routed.ops if f"{p}.experts.down" in op.inputs]
        assert {op.name for op in readers} >= {f"{p}.combine"} and len(readers) > 1
        assert not any(f"{PREFIX}{p}.experts.down" in op.inputs for op in routed.ops)


def test_the_kept_values_live_into_the_backward_and_fulls_do_not(steps):
    for mode, held in (("routed", True), ("full", False)):
        graph = steps[mode]
        order = topological_order(graph)
        ranges = live_ranges(graph, order)
        for layer in range(SMALL.layers):
            first_copy = min(i for i, op in enumerate(order) if op.name.startswith(f"{PREFIX}layer{layer}."))
            for name in KEPT:
                assert (ranges[f"layer{layer}.{name}"][1] > first_copy) is held, (mode, name)


def test_layers_without_routed_experts_are_left_as_they_are():
    dense = graph_from_json(gpt(replace(SMALL, moe_experts=0), training=True))
    assert with_recomputation(dense, "routed") is dense


def test_the_moe_generators_experts_are_found_by_their_loops():
    # `generate moe`: experts fc1 / act / fc2, the dispatch and combine of models/moe.py
    graph = with_recomputation(graph_from_json(moe(MoEConfig(layers=1, batch=2, seq=16, hidden=8, ffn=16, experts=4),
                                                   training=True)), "routed")
    assert copies(graph, 0) == {"experts.fc1", "experts.act", "gates", "gates_per_slot", "combine_weights",
                                "router"}


def token_moves(mode: str) -> dict[tuple[str, str], tuple[list[str], float]]:
    """Layer 1's reshardings of the dispatched tokens and the experts' outputs (and of their
    copies) in an expert-parallel plan (experts over ep): per (value, reader), the collectives'
    kinds and seconds."""
    document = gpt(LARGE, training=True)
    mesh = Mesh.of(ep=4)
    document["constraints"] = llama_constraints(document, False, ("ep",), expert_axes=("ep",))
    graph = with_recomputation(graph_from_json(document, mesh), mode, mesh)
    result = make_plan(graph, mesh, bind_hardware("dgx-h100", mesh),
                       SolveSettings(time_limit_s=30, deterministic=True, workers=1))
    return {(r["tensor"], r["consumer"]): ([s["kind"] for s in r["steps"]], sum(s["seconds"] for s in r["steps"]))
            for r in result.report.to_json()["reshardings"]
            if r["tensor"].removeprefix(PREFIX) in {f"layer1.{name}" for name in KEPT}}


def test_under_expert_parallelism_the_recomputed_experts_move_no_token():
    full, routed = token_moves("full"), token_moves("routed")
    into_copies = {pair: moved for pair, moved in full.items() if pair[1].startswith(PREFIX)}
    # full dispatches and combines again: the copies' tokens go to their experts and back by all-to-alls
    assert {kinds[0] for kinds, _ in into_copies.values()} == {"all_to_all"}
    assert {t for t, _ in into_copies} == {f"{PREFIX}layer1.{name}" for name in KEPT}
    assert all(seconds > 0 for _, seconds in into_copies.values())
    # routed: the copies read the kept tokens where the forward's experts read them (nothing to move), and
    # the only all-to-alls are the forward's two
    assert not any(reader.startswith(PREFIX) for _, reader in routed)
    assert sorted(pair for pair, (kinds, _) in routed.items() if "all_to_all" in kinds) == [
        ("layer1.mlp.dispatch_tokens", "layer1.mlp.experts.gate"), ("layer1.mlp.experts.down", "layer1.mlp.combine")]
