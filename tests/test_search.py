"""Configuration search: the candidates (exact lists), their equivalence classes, the certified
lower bound against solved plans, pruning, the CLI end to end, the service and Ray."""

from __future__ import annotations

import itertools
import json
import math
import time
from pathlib import Path

import pytest

from autoshard.cli.main import main
from autoshard.graph.schema import load_graph
from autoshard.mesh import Mesh
from autoshard.mlir import verify
from autoshard.models.gpt import GPTConfig, gpt
from autoshard.models.mlp import MLPConfig, mlp
from autoshard.planning.formulation import formulate
from autoshard.planning.make_plan import SolveSettings, make_plan
from autoshard.planning.plan import plan_from_json
from autoshard.search.bound import consumer_bound_ps, least_peak_bytes, objective_lower_bound_ps
from autoshard.search.candidates import (
    Candidate,
    dim_symmetries,
    enumerate_candidates,
    machines_for,
    ordered_factorizations,
    placement_signature,
    placements_of,
)
from autoshard.search.run import SearchOptions, search
from autoshard.search.tasks import SearchInputs, bind_candidate
from autoshard.sim.program import verify_plan
from support.cli import MLP as BUDGET_MLP
from support.service import MLP

EXAMPLE = Path(__file__).parent.parent / "examples" / "mlp.json"
SETTINGS = SolveSettings(time_limit_s=10, workers=1, deterministic=True)


def labels(topology: str, devices: int, **options) -> list[str]:
    return [c.label for c in enumerate_candidates(topology, devices, **options).candidates]


def test_ordered_factorizations_are_every_tuple_of_factors_of_at_least_two():
    assert ordered_factorizations(12, 2) == [(2, 6), (3, 4), (4, 3), (6, 2)]
    assert ordered_factorizations(8, 3) == [(2, 2, 2)]
    assert ordered_factorizations(8, 4) == []
    assert ordered_factorizations(7, 1) == [(7,)]


def test_one_gpu_node_has_one_candidate_per_multiset_of_sizes():
    # inside a node every GPU reaches every other over the switch: only the sizes matter
    assert labels("dgx-h100", 8) == ["a0=8 [a0:gpu]", "a0=4,a1=2 [a0:gpu a1:gpu]",
                                     "a0=2,a1=2,a2=2 [a0:gpu a1:gpu a2:gpu]"]


def test_two_gpu_nodes_list_which_axes_cross_the_network():
    assert labels("dgx-h100", 16) == [
        "a0=16 [a0:node+gpu]",
        "a0=2,a1=8 [a0:node a1:gpu]",
        "a0=4,a1=4 [a0:node+gpu a1:gpu]",
        "a0=8,a1=2 [a0:node+gpu a1:gpu]",
        "a0=2,a1=4,a2=2 [a0:node a1:gpu a2:gpu]",
        "a0=4,a1=2,a2=2 [a0:node+gpu a1:gpu a2:gpu]",
        "a0=2,a1=2,a2=2,a3=2 [a0:node a1:gpu a2:gpu a3:gpu]",
    ]
    assert labels("dgx-h100", 16, max_axes=2) == labels("dgx-h100", 16)[:4]
    # a fixed axis keeps its name and size; the others are named by position
    assert labels("dgx-h100", 16, max_axes=2, fixed={"tp": 8}) == [
        "a0=2,tp=8 [a0:node tp:gpu]", "tp=8,a1=2 [tp:node+gpu a1:gpu]"]


def test_tpu_candidates_take_every_slice_shape_and_torus_dims():
    assert labels("tpu-v5p", 8, max_axes=2) == [
        "a0=8 [a0:x+y+z on 2x2x2]", "a0=8 [a0:y+z on 1x2x4]", "a0=8 [a0:z on 1x1x8]",
        "a0=2,a1=4 [a0:y a1:z on 1x2x4]", "a0=2,a1=4 [a0:z a1:y+z on 1x2x4]", "a0=2,a1=4 [a0:z a1:z on 1x1x8]",
        "a0=4,a1=2 [a0:x+y a1:z on 2x2x2]", "a0=4,a1=2 [a0:y+z a1:z on 1x2x4]", "a0=4,a1=2 [a0:z a1:z on 1x1x8]"]
    machines = machines_for("tpu-v5p", 64)
    assert sorted(tuple(sorted(m.slice_shape)) for m in machines) == sorted(
        {tuple(sorted(m.slice_shape)) for m in machines})  # one of each shape up to the order of x, y, z
    assert (4, 4, 4) in [tuple(sorted(m.slice_shape)) for m in machines]


def _collective_prices(hardware, names) -> list[float]:
    """Every collective's time over every group of axes, as a multiset (axis names aside)."""
    prices = []
    for kind in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        for count in range(1, len(names) + 1):
            for group in itertools.combinations(names, count):
                prices.append(round(hardware.collective_seconds(kind, list(group), 3 * 2 ** 20), 15))
    return sorted(prices)


@pytest.mark.parametrize("topology, devices", [("dgx-h100", 16), ("tpu-v5p", 16)])
def test_equivalent_placements_price_every_collective_alike(topology, devices):
    """What makes two placements one candidate must leave every collective's price unchanged, and
    the enumeration keeps exactly one per class."""
    inputs = SearchInputs({}, topology, SETTINGS)
    classes: dict[tuple, list[list[float]]] = {}
    for machine in machines_for(topology, devices):
        symmetries = dim_symmetries(machine)
        for sizes in [s for parts in (1, 2, 3) for s in ordered_factorizations(devices, parts)]:
            names = tuple(f"a{i}" for i in range(len(sizes)))
            for segments, mapping in placements_of(machine, names, sizes):
                candidate = Candidate(names, sizes, mapping, machine.nodes, machine.slice_shape or None)
                prices = _collective_prices(bind_candidate(inputs, candidate), names)
                classes.setdefault(placement_signature(machine, segments, names, symmetries), []).append(prices)
    assert any(len(members) > 1 for members in classes.values())
    for members in classes.values():
        assert all(m == members[0] for m in members)
    assert len(enumerate_candidates(topology, devices, max_axes=3).candidates) == len(classes)


def _graphs():
    yield "mlp", json.loads(EXAMPLE.read_text())
    yield "mlp-training", mlp(MLPConfig(layers=1, batch=8, hidden=64), training=True)
    yield "gpt", gpt(GPTConfig(layers=1, hidden=64, heads=4, seq=16, batch=2, vocab=128))


@pytest.mark.parametrize("name, document", list(_graphs()), ids=[name for name, _ in _graphs()])
def test_the_bound_is_below_every_solved_plan(name, document):
    inputs = SearchInputs(document, "dgx-h100", SETTINGS)
    one_node = enumerate_candidates("dgx-h100", 8).candidates if name != "gpt" else []  # the gpt's solves take longest
    for candidate in one_node + enumerate_candidates("dgx-h100", 16, max_axes=2).candidates:
        mesh = candidate.mesh
        graph = load_graph(document, mesh)
        hardware = bind_candidate(inputs, candidate)
        problem = formulate(graph, mesh, hardware).problem
        solved = make_plan(graph, mesh, hardware, SETTINGS).solver
        bound = objective_lower_bound_ps(problem)
        assert 0 < consumer_bound_ps(problem) <= bound <= solved["objective_ps"], candidate.label
        assert least_peak_bytes(problem) > 0


def test_pruned_candidates_could_not_have_won():
    document = json.loads(EXAMPLE.read_text())
    result = search(document, SearchOptions(devices=8, topology="dgx-h100", settings=SETTINGS, jobs=1))
    # one at a time, the second candidate (bound equal to the first plan) cannot beat it either
    assert result.counts == {"placements": 4, "candidates": 3, "pruned": 2, "solved": 1, "infeasible": 0,
                             "unsolved": 0}
    pruned = [e for e in result.entries if e.outcome == "pruned"]
    best = result.best.solved["objective_ps"]
    for entry in pruned:
        assert entry.bound_ps >= best and "bound" in entry.reason and result.best.candidate.label in entry.reason
        mesh = entry.candidate.mesh
        solved = make_plan(load_graph(document, mesh), mesh, bind_candidate(SearchInputs(document, "dgx-h100",
                                                                                         SETTINGS), entry.candidate),
                           SETTINGS).solver
        assert solved["objective_ps"] >= best
    # solved best-bound first, ranked by objective; the certified bound covers every candidate
    objectives = [e.solved["objective_ps"] for e in result.entries if e.outcome == "solved"]
    assert objectives == sorted(objectives) and result.certified_bound_ps <= best
    assert result.gap == pytest.approx((best - result.certified_bound_ps) / best)


def test_a_memory_budget_prunes_the_meshes_that_cannot_hold_the_weights():
    # two 1 MiB f32 weights: under 1.5 MiB per device a mesh must split them over at least 2 devices each
    options = SearchOptions(devices=2, topology="dgx-h100", jobs=1,
                            settings=SolveSettings(time_limit_s=10, workers=1, deterministic=True,
                                                   memory_budget_bytes=1.5 * 2 ** 20))
    result = search(BUDGET_MLP, options)
    assert [e.outcome for e in result.entries] == ["solved"]
    tight = SearchOptions(devices=2, topology="dgx-h100", jobs=1,
                          settings=SolveSettings(time_limit_s=10, workers=1, deterministic=True,
                                                 memory_budget_bytes=0.5 * 2 ** 20))
    refused = search(BUDGET_MLP, tight)
    assert refused.best is None and refused.counts["pruned"] == 1
    entry = refused.entries[0]
    assert "memory budget" in entry.reason and entry.bound["least_peak_bytes"] > 0.5 * 2 ** 20


def test_search_command_writes_the_ranking_and_the_winning_plan(tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["search", str(EXAMPLE), "--devices", "8", "--topology", "dgx-h100", "--deterministic",
                 "--jobs", "2", "--emit", "annotated,partitioned", "-o", str(out)])
    assert code == 0
    ranking = json.loads((out / "ranking.json").read_text())
    plan = json.loads((out / "plan.json").read_text())
    assert ranking["format"] == "autoshard.ranking/v1" and ranking["counts"]["candidates"] == 3
    assert ranking["counts"]["solved"] + ranking["counts"]["pruned"] == 3
    best = ranking["ranking"][0]
    assert best["rank"] == 1 and best == ranking["best"]
    assert plan["mesh"] == best["mesh"] and plan["topology_options"]["mapping"] == best["placement"]["mapping"]
    assert plan["solver"]["objective_s"] == pytest.approx(best["objective_s"])
    assert plan["totals"]["step_s"] == pytest.approx(best["step_s"])
    assert set(best["communication_s_per_axis"]) == {a["name"] for a in best["mesh"]["axes"]}
    assert plan["verification"]["status"] == "passed"
    verify((out / "annotated.mlir").read_text(), "mesh")
    verify((out / "partitioned.mlir").read_text(), "mesh")
    # the written plan runs like the graph in the simulator
    mesh = Mesh(tuple(a["name"] for a in plan["mesh"]["axes"]), tuple(a["size"] for a in plan["mesh"]["axes"]))
    graph = load_graph(str(EXAMPLE), mesh)
    assert verify_plan(plan_from_json(plan, graph, mesh)).passed
    # `simulate` places the mesh as the plan's topology_options say (the winner's mapping)
    assert main(["simulate", str(EXAMPLE), "--plan", str(out / "plan.json")]) == 0
    printed = capsys.readouterr().out
    assert "3 candidates: 1 pruned, 2 solved" in printed and best["placement"]["mapping"] and "best: " in printed


@pytest.mark.parametrize("flags, where", [
    (["--devices", "1"], "--devices"),
    (["--devices", "8", "--max-axes", "5"], "--max-axes"),
    (["--devices", "8", "--fix", "tp=3"], "--fix"),
    (["--devices", "8", "--fix", "tp=1"], "--fix tp"),
    (["--devices", "8", "--fix", "a1=2"], "--fix a1"),
    (["--devices", "8", "--topology", "no-such"], "--topology"),
    (["--devices", "12", "--topology", "dgx-h100"], "--devices"),
    (["--devices", "8", "--jobs", "0"], "--jobs"),
    (["--devices", "8", "--time-budget", "-1"], "--time-budget"),
    (["--devices", "8", "--memory-budget", "lots"], "--memory-budget"),
    (["--devices", "8", "--ray", "nonsense"], "--ray"),
    (["--devices", "8", "--ray", "127.0.0.1:1"], "--ray"),  # nothing listens there: refused at once
])
def test_every_bad_flag_is_named(flags, where, capsys):
    assert main(["search", str(EXAMPLE), *flags]) == 2
    err = capsys.readouterr().err
    assert f"  {where}: " in err and "Traceback" not in err


def test_a_graph_that_is_not_a_graph_is_refused_before_any_solve(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "autoshard.graph/v1", "tensors": {}, "ops": [{"name": "x"}]}))
    assert main(["search", str(bad), "--devices", "8"]) == 2
    assert "/ops/0" in capsys.readouterr().err


def test_a_spent_time_budget_leaves_candidates_unsolved():
    document = gpt(GPTConfig(layers=1, hidden=64, heads=4, seq=16, batch=2, vocab=128))
    options = SearchOptions(devices=16, topology="dgx-h100", max_axes=2, jobs=1, time_budget_s=1e-3,
                            settings=SolveSettings(time_limit_s=5, workers=1))
    result = search(document, options)
    assert result.counts["unsolved"] == result.counts["candidates"] - result.counts["pruned"]
    assert all(e.reason.startswith("the search's time budget was spent") for e in result.entries
               if e.outcome == "unsolved")


def test_cancelling_stops_the_search():
    from autoshard.search.run import SearchCancelled

    calls = []

    def cancelled() -> bool:
        calls.append(1)
        return len(calls) > 1

    with pytest.raises(SearchCancelled):
        search(json.loads(EXAMPLE.read_text()), SearchOptions(devices=8, topology="dgx-h100", settings=SETTINGS,
                                                                jobs=1), cancelled=cancelled)


def test_ray_gives_the_local_ranking_under_deterministic():
    pytest.importorskip("ray")
    document = gpt(GPTConfig(layers=1, hidden=64, heads=4, seq=16, batch=2, vocab=128))
    options = dict(devices=16, topology="dgx-h100", max_axes=2, jobs=2, settings=SETTINGS)
    local = search(document, SearchOptions(**options))
    on_ray = search(document, SearchOptions(**options, ray="auto"))
    assert on_ray.where.startswith("Ray") and local.where.startswith("2 local")

    def ranking(result):
        return [(e.candidate.label, e.outcome, e.bound_ps, e.solved and e.solved["objective_ps"],
                 e.solved and e.solved["plan"]) for e in result.entries]

    assert ranking(on_ray) == ranking(local) and local.counts == on_ray.counts
    assert math.isfinite(local.certified_bound_ps) and local.best is not None


def _poll(http, location: str, timeout_s: float = 120.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        body = http.get(location).json()
        if body["status"] in ("done", "failed", "cancelled") or time.monotonic() > deadline:
            return body
        time.sleep(0.2)


def test_the_service_searches_like_the_library(http):
    request = {"graph": MLP, "devices": 8, "topology": "dgx-h100",
               "options": {"deterministic": True, "time_limit_s": 10}}
    response = http.post("/v1/searches", json=request)
    assert response.status_code == 202 and response.json()["status"] in ("queued", "searching")
    body = _poll(http, response.headers["Location"])
    assert body["status"] == "done", body["error"]
    ranking, plan = body["ranking"], body["plan"]
    assert ranking["counts"]["candidates"] == 3 and ranking["counts"]["solved"] >= 1
    assert plan["format"] == "autoshard.plan/v1" and plan["mesh"] == ranking["best"]["mesh"]
    direct = search(MLP, SearchOptions(devices=8, topology="dgx-h100", jobs=1,
                                       settings=SolveSettings(time_limit_s=10, workers=1, deterministic=True)))
    assert ranking["best"]["objective_s"] * 1e12 == pytest.approx(direct.best.solved["objective_ps"])
    assert body["progress"]["phase"] == "solve" and body["progress"]["done"] == body["progress"]["total"]
    # a finished search cannot be cancelled
    assert http.delete(response.headers["Location"]).status_code == 409
    assert http.get("/v1/searches/nope").status_code == 404


@pytest.mark.parametrize("change, where", [
    ({"devices": 1}, "/devices"),
    ({"devices": 12}, "/devices"),
    ({"topology": "no-such"}, "/topology"),
    ({"options": {"fix": {"tp": 3}}}, "/options/fix"),
    ({"options": {"fix": {"tp": 1}}}, "/options/fix/tp"),
    ({"options": {"max_axes": 5}}, "/options/max_axes"),
    ({"options": {"time_limit_s": 1e6}}, "/options/time_limit_s"),
    ({"options": {"time_budget_s": 1e6}}, "/options/time_budget_s"),
    ({"graph": {"format": "autoshard.graph/v1", "tensors": {}, "ops": [{"name": "x"}]}}, "/graph/ops/0"),
])
def test_the_service_names_every_bad_field(http, change, where):
    request = {"graph": MLP, "devices": 8, "topology": "dgx-h100"} | change
    response = http.post("/v1/searches", json=request)
    assert response.status_code == 422
    problems = response.json()["error"]["problems"]
    assert any(p["where"].startswith(where) for p in problems), problems


def test_a_search_in_the_service_can_be_cancelled(http):
    # 13 candidates on 64 GPUs: many seconds of work, of which the workers' start alone outlasts the cancel
    response = http.post("/v1/searches", json={"graph": MLP, "devices": 64, "topology": "dgx-h100"})
    assert response.status_code == 202
    cancelled = http.delete(response.headers["Location"])
    assert cancelled.status_code == 200
    assert _poll(http, response.headers["Location"])["status"] == "cancelled"


def test_a_candidate_the_graphs_constraints_do_not_fit_is_infeasible_with_the_reason():
    document = json.loads(EXAMPLE.read_text())
    # the output pinned split over a fixed axis "tp": meshes without it cannot hold the pin
    document["constraints"] = [{"tensor": "layer1.fc2", "split_axes": [["tp"], []], "required": True}]
    result = search(document, SearchOptions(devices=8, topology="dgx-h100", settings=SETTINGS, jobs=1,
                                            max_axes=2, fixed={"tp": 2}))
    outcomes = {e.candidate.label: e.outcome for e in result.entries}
    assert outcomes["a0=4,tp=2 [a0:gpu tp:gpu]"] == "solved"
    unfit = search(document, SearchOptions(devices=8, topology="dgx-h100", settings=SETTINGS, jobs=1, max_axes=1))
    assert unfit.best is None and [e.outcome for e in unfit.entries] == ["infeasible"]
    assert "tp" in unfit.entries[0].reason


def test_the_service_refuses_more_devices_than_its_setting(tmp_path):
    from fastapi.testclient import TestClient

    from service.app import create_app
    from support.service import settings_for

    with TestClient(create_app(settings_for(tmp_path, max_devices=8))) as http:
        response = http.post("/v1/searches", json={"graph": MLP, "devices": 16, "topology": "dgx-h100"})
    assert response.status_code == 422
    assert [p["where"] for p in response.json()["error"]["problems"]] == ["/devices"]


def test_a_candidates_solve_takes_the_resharding_prices_its_bound_found(monkeypatch):
    import autoshard.planning.formulation as formulation
    from autoshard.search.tasks import bound_candidate, solve_candidate

    document = json.loads(EXAMPLE.read_text())
    inputs = SearchInputs(document, "dgx-h100", SETTINGS)
    candidate = next(c for c in enumerate_candidates("dgx-h100", 8).candidates if len(c.axis_sizes) == 3)
    known = bound_candidate(inputs, candidate)["prices"]
    fresh = solve_candidate(inputs, candidate, 10.0)
    asked = []
    real = formulation.resharding_cost
    monkeypatch.setattr(formulation, "resharding_cost", lambda *args: asked.append(args) or real(*args))
    reused = solve_candidate(inputs, candidate, 10.0, known)
    # the bound's formulation asked every pair the solve's two formulations (shared and per use) ask
    assert asked == [] and sum(len(row) for rows in known.rows.values() for row in rows.values()) > 100
    assert reused["plan"] == fresh["plan"] and reused["objective_ps"] == fresh["objective_ps"]


class _InlinePool:
    """The search's tasks run one at a time in this process, each submission recorded."""

    slots, where = 1, "inline"

    def __init__(self, inputs: SearchInputs):
        from autoshard.search.tasks import run_task

        self.run, self.inputs, self.results, self.submitted, self.found = run_task, inputs, [], [], {}

    def submit(self, kind, candidate, time_limit_s, known=None):
        self.submitted.append((kind, candidate.label, known))
        self.results.append(self.run(self.inputs, kind, candidate, time_limit_s, known))
        if kind == "bound":
            self.found[candidate.label] = self.results[-1]["prices"]
        return len(self.results) - 1

    def wait(self, handles, timeout_s):
        return list(handles)

    def result(self, handle):
        return self.results[handle]

    def close(self, cancel=None):
        pass


def test_the_search_hands_each_bounds_prices_to_its_solve_only(monkeypatch):
    import autoshard.search.run as run

    pools = []
    monkeypatch.setattr(run, "open_pool", lambda inputs, slots, ray: pools.append(_InlinePool(inputs)) or pools[-1])
    result = search(json.loads(EXAMPLE.read_text()), SearchOptions(devices=8, topology="dgx-h100", settings=SETTINGS))
    solves = [(label, known) for kind, label, known in pools[0].submitted if kind == "solve"]
    assert solves and all(known is pools[0].found[label] for label, known in solves)
    # the prices stay out of what the search reports, and are let go once handed over
    assert all(e.prices is None and "prices" not in (e.bound or {}) for e in result.entries)


def test_without_a_time_budget_the_candidates_of_most_axes_are_bounded_first(monkeypatch):
    import autoshard.search.run as run

    pools = []
    monkeypatch.setattr(run, "open_pool", lambda inputs, slots, ray: pools.append(_InlinePool(inputs)) or pools[-1])
    document = json.loads(EXAMPLE.read_text())
    enumerated = [c.label for c in enumerate_candidates("dgx-h100", 8).candidates]
    axes = {c.label: len(c.axis_sizes) for c in enumerate_candidates("dgx-h100", 8).candidates}
    search(document, SearchOptions(devices=8, topology="dgx-h100", settings=SETTINGS))
    bounded = [label for kind, label, _ in pools[-1].submitted if kind == "bound"]
    assert bounded == sorted(enumerated, key=lambda label: -axes[label]) and len(set(axes.values())) > 1
    # under a budget the cheapest come first, so that more are bounded before it is spent
    search(document, SearchOptions(devices=8, topology="dgx-h100", settings=SETTINGS, time_budget_s=600))
    assert [label for kind, label, _ in pools[-1].submitted if kind == "bound"] == enumerated
