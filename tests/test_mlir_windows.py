"""Window ops in MLIR: convolutions of every rank, pooling, and their gradients lower to modules
both verifiers accept, globally and per device."""

from __future__ import annotations

import pytest

from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.mlir import emit_annotated, emit_partitioned
from autoshard.mlir.toolchain import verify_all
from autoshard.models import UNetConfig, unet
from autoshard.planning.options import enumerate_options
from autoshard.planning.plan import Plan
from autoshard.sharding import Sharding
from support.graphs import graph_doc

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
