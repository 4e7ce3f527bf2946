"""Plan a JAX function on a mesh, run it under the plan with XLA on 8 CPU devices, and read back
what XLA compiled: shared by the proof tests and the benchmark.

The plans are pinned the usual way (the batch on `dp`, Megatron specs on `tp` for the weights:
column-parallel in, row-parallel out) and solved for everything else, so they really shard.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax_models import CASES

import autoshard
from autoshard.frontends.jax import compare_collectives, compiled_collectives, from_function, planned_collectives, shard
from autoshard.frontends.jax.collectives import KindComparison
from autoshard.frontends.jax.hlo import Collective
from autoshard.frontends.jax.importer import import_function
from autoshard.graph.model import Graph
from autoshard.graph.schema import graph_from_json
from autoshard.planning.make_plan import PlanResult
from autoshard.planning.options import ShardingOption
from autoshard.planning.plan import Plan
from autoshard.sharding import Sharding

MESHES = ("tp=8", "dp=2,tp=4", "dp=2,tp=2,x=2")
TOPOLOGY = "dgx-h100"
COLUMN_PARALLEL = ("w1", "wq", "wk", "wv", "w_gate", "w_up")  # [in, out] split on out
ROW_PARALLEL = ("w2", "wo", "w_down")  # split on in: their products are partial sums over tp


def hand_annotations(document: dict[str, Any], mesh: autoshard.Mesh) -> list[dict[str, Any]]:
    """Pins: the batch (dim 0 of `x`) on dp, the weights' Megatron specs on tp."""
    pins = [{"tensor": f"params['{w}']", "split_axes": [[], ["tp"]]} for w in COLUMN_PARALLEL]
    pins += [{"tensor": f"params['{w}']", "split_axes": [["tp"]]} for w in ROW_PARALLEL]
    if "dp" in mesh.axis_names:
        pins.append({"tensor": "x", "split_axes": [["dp"]]})
    return [p for p in pins if p["tensor"] in document["tensors"]]


def replicated_peak_bytes(graph: Graph, mesh: autoshard.Mesh, hardware: Any) -> int:
    """Per-device peak memory of the plan that splits nothing."""
    plan = Plan(graph, mesh, {op.name: ShardingOption(((),) * op.nest.num_loops) for op in graph.ops},
                {t.name: Sharding() for t in graph.tensors.values() if t.role != "intermediate"})
    return autoshard.estimate(plan, hardware).peak_memory_bytes


@dataclass(frozen=True)
class Proof:
    case: str
    mesh: str
    result: PlanResult
    replicated_peak_bytes: int
    max_error: float
    planned: list[Collective]
    compiled: list[Collective]
    comparison: list[KindComparison]


def jax_mesh(mesh: autoshard.Mesh, axis_type: str = "Explicit") -> Any:
    kind = getattr(jax.sharding.AxisType, axis_type)
    return jax.make_mesh(mesh.shape, mesh.axis_names, axis_types=(kind,) * len(mesh.shape),
                         devices=jax.devices()[:mesh.num_devices])


@functools.lru_cache(maxsize=None)
def prove(case: str, mesh_text: str) -> Proof:
    f, make_args = CASES[case]
    args = make_args()
    mesh = autoshard.Mesh.parse(mesh_text)
    document = from_function(f, *args, name=case)
    document["constraints"] += hand_annotations(document, mesh)
    graph = graph_from_json(document, mesh)
    hardware = autoshard.bind_hardware(TOPOLOGY, mesh)
    result = autoshard.make_plan(graph, mesh, hardware, autoshard.SolveSettings(deterministic=True))
    sharded = shard(f, result, jax_mesh(mesh))
    got = jax.tree_util.tree_leaves(sharded(*args))
    want = jax.tree_util.tree_leaves(jax.jit(f)(*args))
    error = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip(got, want))
    compiled = compiled_collectives(sharded.lower(*args).compile().as_text())
    planned = planned_collectives(result.plan, hardware.collective_seconds)
    return Proof(case, mesh_text, result, replicated_peak_bytes(graph, mesh, hardware), error, planned, compiled,
                 compare_collectives(planned, compiled))


def pinned_plan(f: Any, args: Any, mesh: autoshard.Mesh,
                pins: dict[str, list[list[str]]]) -> tuple[Graph, Any, PlanResult]:
    """`f` imported with strict, `pins` (tensor -> split axes) added as constraints, planned
    deterministically on `mesh` of `TOPOLOGY`: the graph, the hardware and the plan."""
    document = import_function(f, args, strict=True).document
    document["constraints"] += [{"tensor": t, "split_axes": s} for t, s in pins.items()]
    graph = graph_from_json(document, mesh)
    hardware = autoshard.bind_hardware(TOPOLOGY, mesh)
    return graph, hardware, autoshard.make_plan(graph, mesh, hardware, autoshard.SolveSettings(deterministic=True))
