"""A value read by several uses is resharded once, to its delivered sharding, and every use reads
it from there: the formulation, the report and the partitioned program price and run the same
reshardings, so the solver's objective is what `estimate` says the plan costs."""

from __future__ import annotations

import random

import pytest

from autoshard.graph.schema import graph_from_json
from autoshard.mesh import Mesh
from autoshard.models import GPTConfig, gpt
from autoshard.models.layouts import layout_constraints
from autoshard.planning.formulation import PICOSECONDS, TIE_BREAK_PS_PER_BYTE, Weights, formulate
from autoshard.planning.hardware import bind_hardware
from autoshard.planning.make_plan import SolveSettings, make_plan
from autoshard.planning.microbatches import microbatch, repeat_formulation
from autoshard.planning.report import delivered_shardings, estimate
from autoshard.solver import score
from autoshard.spmd.program import Communicate, partition

CONFIG = GPTConfig(layers=2, hidden=64, heads=4, seq=16, batch=8, vocab=64, style="llama")


def pinned(layout: str) -> dict:
    """A LLaMA training step with its matrices and their moments pinned to a layout (fully-sharded
    data parallel: dim 0 over dp; Megatron tensor parallel: column and row splits over tp) and
    its batch over dp; the rest is the solver's."""
    doc = gpt(CONFIG, training=True)
    doc["constraints"] = layout_constraints(doc, CONFIG.batch, layout)
    return doc


@pytest.mark.parametrize("layout,mesh_text", [("fsdp", "dp=4"), ("tp", "dp=2,tp=2")])
def test_the_objective_of_a_pinned_layout_is_its_estimate(layout, mesh_text):
    mesh = Mesh.parse(mesh_text)
    hw = bind_hardware("dgx-h100", mesh)
    graph = graph_from_json(pinned(layout), mesh)
    result = make_plan(graph, mesh, hw, SolveSettings(time_limit_s=10, workers=1, deterministic=True))
    # values read by several uses (weights by their forward and backward matmuls) resharded once
    delivered = delivered_shardings(result.plan, hw.collective_seconds)
    assert any(d != result.plan.produced(t) for t, d in delivered.items())
    formulation = formulate(graph, mesh, hw, memory_budget_bytes=hw.hbm_bytes)
    held_ps = _tie_break_ps(formulation, result.plan)
    expected = result.report.step_s * PICOSECONDS + held_ps
    assert result.solver["objective_ps"] == pytest.approx(expected, rel=1e-9, abs=_rounding_ps(formulation))
    assert result.solver["lower_bound_ps"] <= result.solver["objective_ps"]


@pytest.mark.parametrize("layout,mesh_text", [("fsdp", "dp=4"), ("tp", "dp=2,tp=2"), ("tp", "dp=2,tp=2,x=2,y=2")])
def test_every_plan_costs_its_estimate(layout, mesh_text):
    """Random plans (partial results, reshardings everywhere), each with its values delivered as
    the report delivers them, cost in the formulation what the report prices: the objective is
    exact for every plan, so a lower bound on it is a lower bound on every plan's estimate. On
    four axes both price the monotone reshardings."""
    mesh = Mesh.parse(mesh_text)
    hw = bind_hardware("dgx-h100", mesh)
    graph = graph_from_json(pinned(layout), mesh)
    weights = Weights(comm_s_per_byte=1e-12)
    formulation = formulate(graph, mesh, hw, weights=weights)
    rng = random.Random(0)
    shared = 0
    for _ in range(4):
        plan = formulation.plan([rng.randrange(len(choices)) for choices in formulation.choices])
        delivered = delivered_shardings(plan, hw.collective_seconds)
        shared += sum(d != plan.produced(t) for t, d in delivered.items())
        report = estimate(plan, hw)
        cost = score(formulation.problem, formulation.solution(plan, delivered)).cost
        expected = ((report.step_s + weights.comm_s_per_byte * report.communication_bytes) * PICOSECONDS
                    + _tie_break_ps(formulation, plan))
        assert cost == pytest.approx(expected, rel=1e-9, abs=_rounding_ps(formulation))
    assert shared > 0  # the plans do deliver values resharded


def test_a_microbatched_plan_costs_its_estimate():
    """A value's delivery is made as often as its first reader runs, in both."""
    mesh = Mesh.parse("dp=4")
    hw = bind_hardware("dgx-h100", mesh)
    m = microbatch(graph_from_json(pinned("fsdp"), mesh), 2)
    formulation = repeat_formulation(formulate(m.graph, mesh, hw), m)
    rng = random.Random(2)
    for _ in range(3):
        plan = formulation.plan([rng.randrange(len(choices)) for choices in formulation.choices])
        report = estimate(plan, hw, m)
        cost = score(formulation.problem, formulation.solution(plan, delivered_shardings(plan, hw.collective_seconds))).cost
        assert cost - _tie_break_ps(formulation, plan) == pytest.approx(report.step_s * PICOSECONDS, rel=1e-9,
                                                                          abs=_rounding_ps(formulation))


def test_the_program_runs_the_reshardings_the_report_prices():
    mesh = Mesh.parse("dp=4")
    hw = bind_hardware("dgx-h100", mesh)
    graph = graph_from_json(pinned("fsdp"), mesh)
    formulation = formulate(graph, mesh, hw)
    plan = formulation.plan([random.Random(1).randrange(len(c)) for c in formulation.choices])
    program = partition(plan, hw.collective_seconds)
    steps = [s for r in estimate(plan, hw).reshardings for s in r["steps"]]
    communicated = [i.step.to_json() for i in program.body if isinstance(i, Communicate)]
    assert sorted(map(repr, communicated)) == sorted(map(repr, steps))
    assert program.communication_seconds() == pytest.approx(estimate(plan, hw).communication_s, rel=1e-12)


def _tie_break_ps(formulation, plan) -> float:
    """The objective's tie-break: 1 ps per MiB each node holds (its strategy's usage)."""
    problem = formulation.problem
    picks = formulation.solution(plan, {})
    return sum(int(problem.node_usages[i][p]) for i, p in enumerate(picks)) * TIE_BREAK_PS_PER_BYTE


def _rounding_ps(formulation) -> int:
    """Each node and edge cost is rounded to a picosecond on its own."""
    return formulation.problem.num_nodes + formulation.problem.num_edges
