"""The emitted compute is run, not only verified: the module for one device of every zoo graph and
of GPT and LLaMA training steps (every backward rule they use, Adam) is lowered to LLVM by
upstream passes, executed by `mlir-runner-22`, and its results equal the numpy reference
evaluation of the graph (the op table's semantics)."""

from __future__ import annotations

import numpy as np
import pytest

from autoshard.graph.builder import GraphBuilder
from autoshard.graph.evaluate import evaluate_graph, random_inputs
from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.mlir import emit_partitioned
from autoshard.models import GPTConfig, gpt
from autoshard.models.training import add_training_step, weighted_sum_loss
from autoshard.planning.options import enumerate_options
from autoshard.planning.plan import Plan
from autoshard.sharding import Sharding
from autoshard.spmd.program import partition
from support.graphs import ZOO
from support.mlir_run import run_module, signature

ONE = Mesh.of(x=1)
ROUNDING = {"bf16": 2.0 ** -8, "f16": 2.0 ** -11}
ADAM = {"adam.one_minus_beta1": 0.1, "adam.one_minus_beta2": 0.001, "adam.step_size": 1e-3, "adam.eps_hat": 1e-8}


TRAINING = {style: gpt(GPTConfig(layers=1, hidden=16, heads=2, seq=8, batch=2, vocab=32, dtype="f32", style=style),
                      training=True) for style in ("gpt", "llama")}
# multi-query attention and routed, fine-grained and shared experts
TRAINING["llama_mqa_moe"] = gpt(GPTConfig(layers=1, hidden=16, heads=2, kv_heads=1, seq=8, batch=2, vocab=32, dtype="f32",
                                          style="llama", moe_experts=4, moe_ffn=8, moe_shared_experts=1), training=True)


def training_inputs(graph) -> dict[str, np.ndarray]:
    inputs = random_inputs(graph, seed=1)
    # Adam's constants and second moments as in training (random ones near zero would make
    # m / sqrt(v) amplify rounding without bound)
    inputs.update({key: np.float32(value) for key, value in ADAM.items() if key in inputs})
    for state in (n for n in inputs if n.startswith("adam.") and n.endswith(".v")):
        inputs[state] = np.abs(inputs[state]) + 0.5
    return inputs


@pytest.mark.parametrize("name", sorted(ZOO) + [f"{style}_training" for style in TRAINING])
def test_the_module_computes_what_the_graph_means(name):
    document = ZOO[name] if name in ZOO else TRAINING[name.removesuffix("_training")]
    graph = graph_from_json(document, ONE)
    assert_module_computes(graph, training_inputs(graph))


def test_the_gradient_of_pow_computes_what_the_graph_means():
    """A base broadcast along a dim (its gradient sums that dim) raised to a power of the program."""
    b = GraphBuilder("pow_step", "f32")
    x, w, p = b.parameter("x", (1, 4), "f32"), b.parameter("w", (3, 4), "f32"), b.input("p", (), "f32")
    loss, seeds = weighted_sum_loss(b, b.op("mul", [b.op("pow", [x, p], "y"), w], "z"), batch_dim=None)
    add_training_step(b, loss, seeds)
    graph = graph_from_json(b.document(), ONE)
    inputs = training_inputs(graph)
    inputs["x"], inputs["p"] = np.abs(inputs["x"]) + 0.5, np.float32(2.5)  # a real power of a positive base
    assert_module_computes(graph, inputs)


def test_gelus_exact_form_and_erf_and_their_gradients_compute_what_the_graph_means():
    """torch's default gelu (x * Phi(x), with math.erf) and erf itself, forward and backward."""
    b = GraphBuilder("erf_step", "f32")
    x, w = b.parameter("x", (3, 4), "f32"), b.parameter("w", (3, 4), "f32")
    y = b.op("add", [b.op("gelu_erf", [x], "gelu"), b.op("erf", [x], "erf")], "y")
    loss, seeds = weighted_sum_loss(b, b.op("mul", [y, w], "z"), batch_dim=None)
    add_training_step(b, loss, seeds)
    graph = graph_from_json(b.document(), ONE)
    assert_module_computes(graph, training_inputs(graph))


def assert_module_computes(graph, inputs: dict[str, np.ndarray]) -> None:
    """The one-device module of `graph`, run on `inputs`, gives the numpy evaluation's outputs."""
    plan = Plan(graph, ONE, {op.name: enumerate_options(op.nest, ONE)[0] for op in graph.ops},
                {t.name: Sharding() for t in graph.tensors.values() if t.role != "intermediate"})
    module = emit_partitioned(partition(plan), "shard")
    names, _, _ = signature(module, graph.name)
    results = run_module(module, graph.name, [inputs[n] for n in names])
    expected = evaluate_graph(graph, inputs)
    assert len(results) == len(graph.outputs)
    for output, got in zip(graph.outputs, results):
        want = expected[output].astype(np.float32)
        # printMemrefF32 prints six significant digits; the module rounds to bf16/f16 where the
        # graph says so, the reference keeps such values in f32.
        rtol = ROUNDING.get(graph.tensors[output].dtype, 2e-5)
        np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * float(np.abs(want).max(initial=1.0)), err_msg=output)
