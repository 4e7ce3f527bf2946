"""The planner against known answers: Megatron MLP, the seeds' weight-stationary MLP, data
parallelism, memory budgets, and exhaustive enumeration on small graphs."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from autoshard.errors import InfeasibleError
from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.planning.formulation import formulate
from autoshard.planning.hardware import bind_hardware
from autoshard.planning.make_plan import SolveSettings, make_plan
from autoshard.planning.options import ShardingOption
from autoshard.planning.plan import plan_from_json
from autoshard.planning.report import estimate
from autoshard.sharding import Sharding
from autoshard.sim.program import verify_plan
from autoshard.solver.problem import score

SETTINGS = SolveSettings(time_limit_s=20, workers=1, seed=0, deterministic=True)


def assert_simulates(result, hw, small_doc: dict | None = None) -> None:
    """The plan, partitioned with the collectives it was priced with, computes what its graph
    computes. A plan for a graph too large to simulate is run on `small_doc`: the same graph
    with smaller dims (options name mesh axes per loop, so they carry over unchanged)."""
    plan = result.plan
    if small_doc is not None:
        plan = dataclasses.replace(plan, graph=graph_from_json(small_doc, plan.mesh))
    verdict = verify_plan(plan, hw.collective_seconds)
    assert verdict.passed, verdict.summary()


def mlp(batch: int, hidden: int, ffn: int, pin_output: list | None = None, mesh: str | None = None) -> dict:
    doc = {
        "format": "autoshard.graph/v1", "name": "mlp",
        "tensors": {"x": {"shape": [batch, hidden], "dtype": "bf16", "role": "input"},
                    "w1": {"shape": [hidden, ffn], "dtype": "bf16", "role": "parameter"},
                    "w2": {"shape": [ffn, hidden], "dtype": "bf16", "role": "parameter"},
                    "h": {"shape": [batch, ffn], "dtype": "bf16"},
                    "a": {"shape": [batch, ffn], "dtype": "bf16"},
                    "y": {"shape": [batch, hidden], "dtype": "bf16"}},
        "ops": [{"name": "fc1", "kind": "matmul", "inputs": ["x", "w1"], "outputs": ["h"]},
                {"name": "act", "kind": "gelu", "inputs": ["h"], "outputs": ["a"]},
                {"name": "fc2", "kind": "matmul", "inputs": ["a", "w2"], "outputs": ["y"]}],
        "outputs": ["y"],
        "constraints": [],
    }
    if pin_output is not None:
        doc["constraints"].append({"tensor": "y", "split_axes": pin_output, "required": True})
    if mesh:
        doc["mesh"] = mesh
    return doc


def brute_force_cost(formulation) -> int:
    problem = formulation.problem
    best = None
    for solution in itertools.product(*(range(len(c)) for c in problem.node_costs)):
        s = score(problem, solution)
        if s.feasible and (best is None or s.cost < best):
            best = s.cost
    return best


def test_megatron_layout_for_weight_dominated_mlp_on_tensor_parallel_mesh():
    mesh = Mesh.parse("tp=8")
    graph = graph_from_json(mlp(8, 8192, 32768, pin_output=[]), mesh)
    hw = bind_hardware("dgx-h100", mesh)
    result = make_plan(graph, mesh, hw, SETTINGS)
    plan = result.plan
    # fc1 column-split (n over tp), fc2 row-split (k over tp), weights stored split the same way
    assert plan.options["fc1"] == ShardingOption(((), ("tp",), ()))
    assert plan.options["act"] == ShardingOption(((), ("tp",)))
    assert plan.options["fc2"] == ShardingOption(((), (), ("tp",)))
    assert plan.storage["w1"] == Sharding(((), ("tp",))) and plan.storage["w2"] == Sharding((("tp",),))
    # exactly one collective: the partial output reduced
    (resharding,) = result.report.reshardings
    assert resharding["tensor"] == "y" and [s["kind"] for s in resharding["steps"]] in (["all_reduce"], ["reduce_scatter", "all_gather"])
    # nothing cheaper exists
    assert result.solver["objective_ps"] == brute_force_cost(formulate(graph, mesh, hw, memory_budget_bytes=hw.hbm_bytes))
    assert result.solver["gap"] <= 1e-9
    assert_simulates(result, hw, mlp(8, 16, 64, pin_output=[]))


def test_objective_equals_the_priced_plan_when_every_value_has_one_consumer():
    mesh = Mesh.parse("tp=8")
    graph = graph_from_json(mlp(8, 8192, 32768, pin_output=[]), mesh)
    hw = bind_hardware("dgx-h100", mesh)
    result = make_plan(graph, mesh, hw, SETTINGS)
    # equal up to the memory tie-breaker (1 ps per MiB held)
    assert result.solver["objective_s"] == pytest.approx(result.report.step_s, rel=1e-4)
    assert result.solver["objective_s"] >= result.report.step_s


def test_data_parallel_for_large_batch_small_weights():
    mesh = Mesh.parse("dp=8")
    graph = graph_from_json(mlp(16384, 512, 512), mesh)
    hw = bind_hardware("dgx-h100", mesh)
    result = make_plan(graph, mesh, hw, SETTINGS)
    for op in ("fc1", "act", "fc2"):
        assert result.plan.options[op].loop_axes[0] == ("dp",), op
    assert result.plan.storage["w1"] == Sharding() and result.plan.storage["x"] == Sharding((("dp",),))
    assert result.report.communication_s == 0.0
    assert_simulates(result, hw, mlp(32, 8, 8))


def test_weights_over_budget_are_stored_sharded_and_the_plan_fits():
    mesh = Mesh.parse("dp=8")
    graph = graph_from_json(mlp(64, 8192, 32768), mesh)  # 1 GiB of weights
    hw = bind_hardware("dgx-h100", mesh)
    budget = 512 * 2 ** 20
    result = make_plan(graph, mesh, hw, SolveSettings(time_limit_s=20, workers=1, memory_budget_bytes=budget, deterministic=True))
    assert result.report.peak_memory_bytes <= budget
    assert result.plan.storage["w1"] != Sharding() and result.plan.storage["w2"] != Sharding()
    unconstrained = make_plan(graph, mesh, hw, SETTINGS)
    assert unconstrained.report.step_s <= result.report.step_s
    assert_simulates(result, hw, mlp(16, 16, 64))


def test_impossible_budget_is_explained():
    mesh = Mesh.parse("dp=2")
    graph = graph_from_json(mlp(64, 8192, 32768), mesh)
    with pytest.raises(InfeasibleError, match="memory budget .* is below"):
        make_plan(graph, mesh, bind_hardware("dgx-h100", mesh),
                  SolveSettings(time_limit_s=5, workers=1, memory_budget_bytes=64 * 2 ** 20, deterministic=True))


def test_pin_that_no_option_can_produce_is_explained():
    doc = mlp(8, 64, 64, mesh="tp=2")
    doc["constraints"] = [{"tensor": "h", "split_axes": [["tp"], ["tp"]], "required": True}]
    mesh = Mesh.parse("tp=2")
    with pytest.raises(Exception, match="used twice|pinned"):
        make_plan(graph_from_json(doc, mesh), mesh, bind_hardware("dgx-h100", mesh), SETTINGS)


WEIGHT_STATIONARY = {
    "format": "autoshard.graph/v1", "name": "mlp_2d_weight_stationary", "mesh": "x=2,y=2,z=2",
    "tensors": {"in": {"shape": [2, 4, 8], "dtype": "f32", "role": "input"},
                "w1": {"shape": [8, 32], "dtype": "f32", "role": "parameter"},
                "w2": {"shape": [32, 8], "dtype": "f32", "role": "parameter"},
                "h": {"shape": [2, 4, 32], "dtype": "f32"},
                "a": {"shape": [2, 4, 32], "dtype": "f32"},
                "out": {"shape": [2, 4, 8], "dtype": "f32"}},
    "ops": [{"name": "fc1", "kind": "matmul", "inputs": ["in", "w1"], "outputs": ["h"]},
            {"name": "relu", "kind": "relu", "inputs": ["h"], "outputs": ["a"]},
            {"name": "fc2", "kind": "matmul", "inputs": ["a", "w2"], "outputs": ["out"]}],
    "outputs": ["out"],
    "constraints": [{"tensor": "in", "split_axes": [[], [], ["x", "y", "z"]]},
                    {"tensor": "w1", "split_axes": [["x"], ["y", "z"]]},
                    {"tensor": "w2", "split_axes": [["y", "z"], ["x"]]},
                    {"tensor": "out", "split_axes": [[], [], ["x", "y", "z"]]}],
}


def test_weight_stationary_mlp_no_worse_than_the_slides():
    """The seeds' 2-D weight-stationary MLP on 2x2x2 with the slides' pins: our plan costs no more
    than the slides' optimised one (fc1 F over [y, z] with E over x; fc2 F over x with E over [y, z])."""
    mesh = Mesh.parse("x=2,y=2,z=2")
    graph = graph_from_json(WEIGHT_STATIONARY, mesh)
    hw = bind_hardware("tpu-v4", mesh)
    ours = make_plan(graph, mesh, hw, SETTINGS)
    slides = plan_from_json({"ops": {"fc1": {"option": [[], [], ["y", "z"], ["x"]]},
                                     "relu": {"option": [[], [], ["y", "z", "x"]]},
                                     "fc2": {"option": [[], [], ["x"], ["y", "z"]]}},
                             "tensors": {"in": [[], [], ["x", "y", "z"]], "w1": [["x"], ["y", "z"]],
                                         "w2": [["y", "z"], ["x"]]}}, graph, mesh)
    assert ours.report.step_s <= estimate(slides, hw).step_s * (1 + 1e-9)
    assert ours.plan.final("out") == Sharding(((), (), ("x", "y", "z")))
    assert_simulates(ours, hw)


@pytest.mark.parametrize("seed", range(6))
def test_solver_optimum_equals_exhaustive_enumeration_on_random_graphs(seed):
    rng = np.random.default_rng(seed)
    b, n = int(rng.choice([4, 8])), int(rng.choice([8, 16]))
    kinds = ["exp", "relu", "tanh"]
    doc = {"format": "autoshard.graph/v1", "name": f"random{seed}",
           "tensors": {"x": {"shape": [b, n], "dtype": "f32", "role": "input"},
                       "w": {"shape": [n, n], "dtype": "f32", "role": "parameter"},
                       "m": {"shape": [b, n], "dtype": "f32"}, "u": {"shape": [b, n], "dtype": "f32"},
                       "s": {"shape": [b], "dtype": "f32"}},
           "ops": [{"name": "mm", "kind": "matmul", "inputs": ["x", "w"], "outputs": ["m"]},
                   {"name": "f", "kind": str(rng.choice(kinds)), "inputs": ["m"], "outputs": ["u"]},
                   {"name": "r", "kind": "reduce_sum", "inputs": ["u"], "outputs": ["s"], "dims": [1]}],
           "outputs": ["s"]}
    mesh = Mesh.parse("a=4")  # small enough to enumerate every plan
    graph = graph_from_json(doc, mesh)
    hw = bind_hardware("tpu-v5e", mesh)
    formulation = formulate(graph, mesh, hw, memory_budget_bytes=hw.hbm_bytes)
    result = make_plan(graph, mesh, hw, SETTINGS)
    assert result.solver["objective_ps"] == brute_force_cost(formulation)
    assert_simulates(result, hw)


def test_a_hint_on_some_tensors_starts_the_solver_and_the_plan_stays_optimal():
    """A non-required constraint on one tensor: the solver starts from it (unhinted nodes at their
    smallest-usage choice) and still finds the optimum of the unhinted graph."""
    mesh = Mesh.parse("dp=2,tp=4")
    hw = bind_hardware("dgx-h100", mesh)
    doc = mlp(batch=64, hidden=256, ffn=1024)
    doc["constraints"].append({"tensor": "h", "split_axes": [["dp"]], "required": False})
    hinted = make_plan(graph_from_json(doc, mesh), mesh, hw, SETTINGS)
    plain = make_plan(graph_from_json(mlp(batch=64, hidden=256, ffn=1024), mesh), mesh, hw, SETTINGS)
    assert hinted.solver["status"] == plain.solver["status"] == "optimal"
    assert hinted.solver["objective_ps"] == plain.solver["objective_ps"]
    assert_simulates(hinted, hw)
