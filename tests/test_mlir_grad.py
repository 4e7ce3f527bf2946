"""Gradient ops in MLIR: every backward rule of the op table has a lowering, and whole training
steps (GPT and LLaMA style: attention, norms, embedding, elementwise slopes, Adam) under sharded
plans emit modules the real MLIR tools parse and verify, in both spellings and both stages."""

from __future__ import annotations

import numpy as np
import pytest

from autoshard.graph.model import Graph
from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.mlir import emit_annotated, emit_partitioned
from autoshard.mlir.lower_grad import GRAD_LOWERINGS
from autoshard.mlir.toolchain import verify_all
from autoshard.models import GPTConfig, gpt
from autoshard.ops.grads import GRAD_RULES
from autoshard.planning.options import enumerate_options, enumerate_storage
from autoshard.planning.plan import Plan

MESH = Mesh.of(x=2, y=2)


def test_every_backward_rule_has_a_lowering():
    assert sorted(GRAD_LOWERINGS) == sorted(GRAD_RULES)


def sharded_plan(graph: Graph, seed: int) -> Plan:
    """Each op takes a split option (a random one of those that split something, where any does)."""
    rng = np.random.default_rng(seed)

    def pick(candidates: list) -> object:
        split = candidates[1:] or candidates  # the first option is the replicated one
        return split[int(rng.integers(len(split)))]

    options = {op.name: pick(enumerate_options(op.nest, MESH)) for op in graph.ops}
    storage = {t.name: pick(enumerate_storage(t.shape, MESH)) for t in graph.tensors.values() if t.role != "intermediate"}
    return Plan(graph, MESH, options, storage)


@pytest.mark.parametrize("style", ["gpt", "llama"])
def test_training_steps_emit_verified_modules(style):
    config = GPTConfig(layers=1, hidden=16, heads=2, seq=8, batch=2, vocab=32, dtype="f32", style=style)
    graph = graph_from_json(gpt(config, training=True), MESH)
    assert {op.attrs["of"] for op in graph.ops if op.kind == "grad"} >= {"attention", "embedding"}
    plan = sharded_plan(graph, seed=7)
    for dialect in ("shard", "mesh"):
        modules = [emit_annotated(plan, dialect=dialect), emit_partitioned(plan, dialect=dialect)]
        verify_all(modules, dialect)
