"""Window ops in MLIR: convolutions of every rank, pooling, and their gradients lower to modules
both verifiers accept, globally and per device, and plans that split them in space (halos,
update_halo) run exactly in the simulator."""

from __future__ import annotations

import numpy as np
import pytest

from autoshard.graph.evaluate import evaluate_graph, random_inputs
from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.mlir import emit_annotated, emit_partitioned
from autoshard.mlir.toolchain import verify_all
from autoshard.models import UNetConfig, unet
from autoshard.planning.options import enumerate_options
from autoshard.planning.plan import Plan
from autoshard.sharding import Sharding
from autoshard.sim.program import verify_plan
from autoshard.spmd.program import partition
from support.graphs import graph_doc
from support.mlir_run import run_module, signature

F = "f32"
MESH = Mesh.of(x=2)


def batch_split_plan(graph) -> Plan:
    """Every op split over its first loop where it can be (the batch), else replicated."""
    options = {}
    for op in graph.ops:
        choices = enumerate_options(op.nest, MESH)
        options[op.name] = next((o for o in choices if o.loop_axes[0] == ("x",)), choices[0])
    return Plan(graph, MESH, options, {t.name: Sharding() for t in graph.tensors.values() if t.role != "intermediate"})


WINDOWS = graph_doc(
    "windows", {"a": ((2, 9, 3), F, "input"), "k1": ((3, 3, 4), F, "parameter"), "b": ((2, 9, 4), F),
                "v": ((2, 4, 5, 6, 2), F, "input"), "k3": ((3, 2, 3, 2, 3), F, "parameter"), "c": ((2, 4, 3, 6, 3), F),
                "img": ((2, 7, 6, 3), F, "input"), "m": ((2, 4, 6, 3), F), "p": ((2, 3, 2, 3), F)},
    [("line", "conv1d", ["a", "k1"], ["b"], {"padding": [[1, 1]]}),
     ("volume", "conv3d", ["v", "k3"], ["c"], {"strides": [1, 2, 1], "padding": [[1, 1], [0, 1], [1, 1]]}),
     ("max", "max_pool2d", ["img"], ["m"], {"window": [3, 3], "strides": [2, 1], "padding": [[1, 1], [1, 1]]}),
     ("mean", "avg_pool2d", ["m"], ["p"], {"window": [2, 3], "padding": [[1, 1], [0, 0]]})], ["b", "c", "p"])


@pytest.mark.parametrize("doc", [WINDOWS, unet(UNetConfig(levels=1, batch=2, height=4, width=4, base=2, dtype=F)),
                                 unet(UNetConfig(levels=1, batch=2, height=4, width=4, base=2, dtype=F), training=True)],
                         ids=["conv1d-conv3d-pools", "unet", "unet-training"])
def test_window_ops_lower_and_verify_in_both_spellings(doc):
    graph = graph_from_json(doc, MESH)
    plan = batch_split_plan(graph)
    texts = {spelling: [emit_annotated(plan, spelling), emit_partitioned(plan, spelling)] for spelling in ("shard", "mesh")}
    annotated = texts["shard"][0]
    if "conv3d" in {op.kind for op in graph.ops}:
        assert "linalg.conv_1d_nwc_wcf" in annotated and "linalg.conv_3d_ndhwc_dhwcf" in annotated
        assert "strides = dense<[1, 2, 1]> : tensor<3xi64>" in annotated
        assert "arith.maximumf" in annotated and "arith.select" in annotated  # max pooling's padding is lowest
    if any(op.kind == "grad" for op in graph.ops):
        assert "tensor.expand_shape" in annotated and "tensor.collapse_shape" in annotated  # pooling gradients
    verify_all(texts["shard"], "shard")
    verify_all(texts["mesh"], "mesh")


def spatial_plan(graph, mesh: Mesh) -> Plan:
    """Every op that reads through windows splits one of their loops (the first such option), every
    other op its second loop (height, for image-shaped values) where it can; storage replicated."""
    options = {}
    for op in graph.ops:
        choices = enumerate_options(op.nest, mesh)
        windowed = [o for o in choices if any(axes and op.nest.windows(l) for l, axes in enumerate(o.loop_axes))]
        second = [o for o in choices if op.nest.num_loops > 1 and o.loop_axes[1] and not any(o.loop_axes[2:])]
        options[op.name] = (windowed or second or choices)[0]
    return Plan(graph, mesh, options, {t.name: Sharding() for t in graph.tensors.values() if t.role != "intermediate"})


@pytest.mark.parametrize("doc", [WINDOWS, unet(UNetConfig(levels=1, batch=1, height=8, width=8, base=2, dtype=F),
                                               training=True)], ids=["conv1d-conv3d-pools", "unet-training"])
def test_plans_splitting_windows_in_space_simulate_exactly_and_verify(doc):
    mesh = Mesh.of(x=2, y=2)
    graph = graph_from_json(doc, mesh)
    plan = spatial_plan(graph, mesh)
    halos = [c for c in partition(plan).communicates() if c.step.kind == "update_halo"]
    assert halos
    verdict = verify_plan(plan)
    assert verdict.passed, verdict
    texts = {spelling: [emit_annotated(plan, spelling), emit_partitioned(plan, spelling)] for spelling in ("shard", "mesh")}
    assert texts["shard"][1].count("shard.update_halo") == len(halos)
    verify_all(texts["shard"], "shard")
    verify_all(texts["mesh"], "mesh")


@pytest.mark.parametrize("doc", [WINDOWS, unet(UNetConfig(levels=1, batch=1, height=4, width=4, base=2, dtype=F),
                                               training=True)], ids=["conv1d-conv3d-pools", "unet-training"])
def test_the_window_modules_compute_what_the_graph_means(doc):
    """Executed by mlir-runner-22 on one device: padding, the lowest value at max pooling's edges,
    the filter and pooling gradients."""
    one = Mesh.of(x=1)
    graph = graph_from_json(doc, one)
    plan = Plan(graph, one, {op.name: enumerate_options(op.nest, one)[0] for op in graph.ops},
                {t.name: Sharding() for t in graph.tensors.values() if t.role != "intermediate"})
    module = emit_partitioned(partition(plan), "shard")
    inputs = random_inputs(graph, seed=1)
    for name in inputs:
        if name.startswith("adam."):  # Adam's scalars and second moments as in training
            inputs[name] = np.abs(inputs[name]) * 1e-2 + (0.5 if name.endswith(".v") else 0.0)
    inputs = {n: v.astype(np.float32) if v.dtype == np.float64 else v for n, v in inputs.items()}
    if "img" in inputs:
        inputs["img"] = -np.abs(inputs["img"]) - 0.5  # every window's maximum is negative: zero padding would win
    names, _, _ = signature(module, graph.name)
    results = run_module(module, graph.name, [inputs[n] for n in names])
    expected = evaluate_graph(graph, inputs)
    for output, got in zip(graph.outputs, results):
        want = expected[output].astype(np.float32)
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * float(np.abs(want).max(initial=1.0)), err_msg=output)
