"""A search's certified gap covers every candidate: one the time budget leaves unformulated gets
an analytic bound (FLOPs over every device at peak, stored bytes over every device), which is
below every plan's objective."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoshard.graph.schema import load_graph
from autoshard.models.mlp import MLPConfig, mlp
from autoshard.planning.formulation import Weights, formulate
from autoshard.planning.make_plan import SolveSettings, make_plan
from autoshard.search.bound import analytic_bound_ps, objective_lower_bound_ps
from autoshard.search.candidates import enumerate_candidates
from autoshard.search.run import Entry, SearchOptions, _result, search
from autoshard.search.tasks import SearchInputs, bind_candidate

EXAMPLE = Path(__file__).parent.parent / "examples" / "mlp.json"
SETTINGS = SolveSettings(time_limit_s=10, workers=1, deterministic=True)


@pytest.mark.parametrize("weights", [Weights(), Weights(time=1, memory_s_per_byte=1e-12)], ids=["time", "memory"])
@pytest.mark.parametrize("name", ["mlp", "mlp-training"])
def test_the_analytic_bound_is_below_the_formulation_bound_and_every_solved_plan(name, weights):
    document = json.loads(EXAMPLE.read_text()) if name == "mlp" else mlp(MLPConfig(layers=1, batch=8, hidden=64),
                                                                         training=True)
    settings = SolveSettings(time_limit_s=10, workers=1, deterministic=True, weights=weights)
    inputs = SearchInputs(document, "dgx-h100", settings)
    for candidate in enumerate_candidates("dgx-h100", 8, max_axes=2).candidates:
        mesh = candidate.mesh
        graph = load_graph(document, mesh)
        hardware = bind_candidate(inputs, candidate)
        analytic = analytic_bound_ps(graph, mesh.num_devices, hardware, weights)
        bound = objective_lower_bound_ps(formulate(graph, mesh, hardware, weights=weights).problem)
        solved = make_plan(graph, mesh, hardware, settings).solver
        assert 0 < analytic <= bound <= solved["objective_ps"], candidate.label


def test_a_spent_time_budget_gives_every_candidate_an_analytic_bound():
    document = json.loads(EXAMPLE.read_text())
    options = SearchOptions(devices=8, topology="dgx-h100", jobs=1, time_budget_s=1e-9, settings=SETTINGS)
    result = search(document, options)
    assert result.counts["unsolved"] == result.counts["candidates"] == 3 and result.best is None
    graph = load_graph(document)
    expected = [analytic_bound_ps(graph, 8, bind_candidate(SearchInputs(document, "dgx-h100", SETTINGS),
                                                           e.candidate), SETTINGS.weights) for e in result.entries]
    assert [e.bound_ps for e in result.entries] == expected and min(expected) > 0
    assert all(e.bound.get("analytic") and "analytic" in e.reason for e in result.entries)
    assert result.certified_bound_ps == min(expected) and result.gap is None


def test_the_certified_bound_takes_the_analytic_bounds_of_unformulated_candidates():
    candidates = enumerate_candidates("dgx-h100", 8, max_axes=2).candidates
    solved = Entry(candidates[0], {}, outcome="solved",
                   solved={"objective_ps": 1000, "lower_bound_ps": 900},
                   bound={"bound_ps": 800, "least_peak_bytes": 1, "memory_budget_bytes": 10})
    unformulated = Entry(candidates[1], {}, outcome="unsolved",
                         bound={"bound_ps": 400, "least_peak_bytes": 0, "memory_budget_bytes": 10, "analytic": True})
    result = _result([solved, unformulated], 2, 0.0, "local")
    assert result.certified_bound_ps == 400 and result.gap == pytest.approx(0.6)
    assert _result([solved], 1, 0.0, "local").gap == pytest.approx(0.1)
