"""`cumulative`, `scatter_add` and `scatter` lowered to MLIR and run: the one-device module,
executed by `mlir-runner-22`, gives the numpy evaluation of the graph (the op table's semantics),
and a split of a scatter's rows compares each id with the row's global index."""

from __future__ import annotations

import re

import numpy as np
import pytest
from test_mlir_execution import assert_module_computes

from autoshard.graph.builder import GraphBuilder
from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.mlir import emit_partitioned
from autoshard.planning.options import ShardingOption
from autoshard.planning.plan import Plan
from autoshard.sharding import Sharding
from autoshard.spmd.program import partition

ONE = Mesh.of(x=1)
rng = np.random.default_rng(5)


@pytest.mark.parametrize("attrs", [
    {"axis": 1, "reduction": "sum"}, {"axis": 0, "reduction": "max", "reverse": True},
    {"axis": 1, "reduction": "product", "reverse": True}, {"axis": 0, "reduction": "min"},
])
def test_a_running_reduction_runs_as_the_graph_means(attrs):
    b = GraphBuilder("running", "f32")
    x = b.input("x", (3, 5), "f32")
    b.mark_outputs(b.op("cumulative", [x], "y", **attrs))
    assert_module_computes(graph_from_json(b.document(), ONE), {"x": rng.uniform(0.5, 1.5, (3, 5)).astype(np.float32)})


def scatters() -> tuple[GraphBuilder, dict[str, np.ndarray]]:
    b = GraphBuilder("scatters", "f32")
    ids, written = b.input("ids", (2, 3), "i32"), b.input("written", (4,), "i32")
    updates, rows = b.input("updates", (2, 3, 4), "f32"), b.input("rows", (4, 4), "f32")
    table = b.input("table", (6, 4), "f32")
    summed = b.op("scatter_add", [ids, updates], "summed", rows=6)
    b.mark_outputs(summed, b.op("scatter", [table, written, rows], "set"))
    values = {"ids": np.array([[5, 0, 5], [2, 7, 1]], np.int32), "written": np.array([4, 1, 9, 0], np.int32),
              **{name: rng.uniform(-1, 1, shape).astype(np.float32)
                 for name, shape in (("updates", (2, 3, 4)), ("rows", (4, 4)), ("table", (6, 4)))}}
    return b, values


def test_scatters_run_as_the_graph_means_dropping_ids_out_of_range():
    b, values = scatters()
    assert_module_computes(graph_from_json(b.document(), ONE), values)


def test_a_split_of_a_scatters_rows_compares_ids_with_global_rows():
    b, _ = scatters()
    mesh = Mesh.of(x=2)
    graph = graph_from_json(b.document(), mesh)
    options = {op.name: ShardingOption((("x",),) + ((),) * (op.nest.num_loops - 1)) for op in graph.ops}
    plan = Plan(graph, mesh, options, {t.name: Sharding() for t in graph.tensors.values() if t.role != "intermediate"})
    module = emit_partitioned(partition(plan), "shard")
    # in both scatters, each device adds its block's first row to the row loop's index
    assert len(re.findall(r"= arith\.addi %i0\S*, %start\S* : index\n\s*%hit\S* = arith\.cmpi eq", module)) == 2
