"""The working form and neighbourhoods keep costs and memory feasibility exact; the heuristic path is sound."""

from dataclasses import replace

import numpy as np
import pytest

from autoshard.solver import exact as exact_module
from autoshard.solver import score, solve
from autoshard.solver.flat import flatten, only_steps
from autoshard.solver.problem import FORBIDDEN_COST
from autoshard.solver.subproblem import restrict
from support.solver_problems import (
    enumerate_optimum,
    flat_assignments,  # noqa: F401
    random_problem,
)


@pytest.mark.parametrize("seed", range(12))
def test_flatten_keeps_cost_and_feasibility(seed):
    # Parallel edges merged, forbidden strategies dropped, memory rows merged: same answers.
    problem = random_problem(300 + seed, limited=True, forbidden=seed % 2 == 0)
    fp = flatten(problem)
    for x in flat_assignments(fp):
        truth = score(problem, fp.to_original(x))
        if truth.forbidden == 0:
            assert fp.objective(x) == truth.cost
        assert fp.fits(x) == truth.feasible


@pytest.mark.parametrize("seed", range(8))
def test_neighbourhood_keeps_cost_differences_and_memory(seed):
    problem = random_problem(400 + seed, limited=True)
    fp = flatten(problem)
    rng = np.random.default_rng(seed)
    x = np.array([rng.integers(s) for s in fp.sizes()])
    nodes = np.sort(rng.choice(fp.n, size=max(1, fp.n // 2), replace=False))
    sub = restrict(fp, nodes, x)
    for y in flat_assignments(sub):
        full = x.copy()
        full[nodes] = y
        assert sub.objective(y) - sub.objective(x[nodes]) == pytest.approx(fp.objective(full) - fp.objective(x))
        assert sub.fits(y) == fp.fits(full)


def test_heuristic_path_is_feasible_and_bounded(monkeypatch):
    monkeypatch.setattr(exact_module, "EXACT_PAIR_LIMIT", -1)
    for seed in range(500, 510):
        problem = random_problem(seed, limited=True)
        expected = enumerate_optimum(problem)
        result = solve(problem, time_limit_s=5, seed=0, deterministic=True)
        assert result.stats["method"] == "heuristic"
        assert result.feasible and result.cost >= expected >= result.lower_bound


def test_contest_instance_b_working_form_and_bound():
    from pathlib import Path

    from autoshard.solver import read_iopddl
    from autoshard.solver.heuristic import smallest_usage
    from autoshard.solver.lagrange import Relaxation

    problem = read_iopddl(Path(__file__).parent / "data" / "iopddl_B.json.gz")
    fp = flatten(problem)
    x = smallest_usage(fp)
    truth = score(problem, fp.to_original(x))
    assert fp.fits(x) == truth.feasible
    relaxation = Relaxation(fp)
    relaxation.run(60)
    # Without memory multipliers the bound is that of the problem without a limit (134699).
    assert 134000 < relaxation.bound() <= 134699 <= 532843  # 532843: the contest's best answer


@pytest.mark.parametrize("seed", range(8))
def test_only_steps_keeps_the_memory_rows_of_those_steps_and_drops_the_others(seed):
    fp = flatten(random_problem(760 + seed, limited=True))
    steps = fp.row_steps
    everything = only_steps(fp, int(steps.min(initial=0)), int(steps.max(initial=0)) + 1)
    first = int(steps[len(steps) // 2]) if len(steps) else 0
    upper = only_steps(fp, first, 1 << 30)
    kept = steps >= first
    for x in flat_assignments(fp):
        assert everything.fits(x) == fp.fits(x)
        assert np.array_equal(upper.row_load(x), fp.row_load(x)[kept])
        assert np.array_equal(upper.cap, fp.cap[kept])
        assert upper.objective(x) == fp.objective(x)


def _arc_consistent_reference(problem) -> list[np.ndarray]:
    """Strategies kept by edge-by-edge arc consistency, one node array at a time."""
    keep = [c < FORBIDDEN_COST for c in problem.node_costs]
    keep = [k if k.any() else np.ones_like(k) for k in keep]
    changed = True
    while changed:
        changed = False
        for (u, v), matrix in zip(problem.edges.tolist(), problem.edge_costs):
            allowed = matrix < FORBIDDEN_COST
            row_ok = (allowed & keep[v][None, :]).any(axis=1)
            col_ok = (allowed & keep[u][:, None]).any(axis=0)
            for node, ok in ((u, row_ok), (v, col_ok)):
                new = keep[node] & ok
                if new.any() and not np.array_equal(new, keep[node]):
                    keep[node], changed = new, True
    return keep


@pytest.mark.parametrize("seed", range(40))
def test_flatten_keeps_exactly_the_arc_consistent_strategies(seed):
    problem = random_problem(seed, limited=True, forbidden=True)
    rng = np.random.default_rng(seed)
    # Denser forbidden entries than the generator's, and some forbidden strategies, so that
    # dropping one strategy makes another lose its last partner.
    matrices = tuple(np.where(rng.random(m.shape) < 0.5, FORBIDDEN_COST, m) for m in problem.edge_costs)
    costs = tuple(np.where(rng.random(c.shape) < 0.3, FORBIDDEN_COST, c) for c in problem.node_costs)
    problem = replace(problem, edge_costs=matrices, node_costs=costs)
    fp = flatten(problem)
    expected = _arc_consistent_reference(problem)
    for v, keep in enumerate(expected):
        assert fp.orig[fp.soff[v]:fp.soff[v + 1]].tolist() == np.flatnonzero(keep).tolist()


@pytest.mark.parametrize("seed", range(20))
def test_edges_sharing_one_matrix_object_flatten_as_copies_would(seed):
    problem = random_problem(seed, limited=True, forbidden=True)
    first: dict[tuple[int, ...], np.ndarray] = {}
    shared = replace(problem, edge_costs=tuple(first.setdefault(m.shape, m) for m in problem.edge_costs))
    copied = replace(shared, edge_costs=tuple(m.copy() for m in shared.edge_costs))
    a, b = flatten(shared), flatten(copied)
    for name in ("soff", "orig", "cost", "use", "eu", "ev", "moff", "mat", "r0", "r1", "cap"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name


@pytest.mark.parametrize("seed", range(20))
def test_the_shared_layout_stores_each_distinct_matrix_once_and_reads_as_the_flat_one(seed):
    problem = random_problem(seed, limited=True, forbidden=True)
    first: dict[tuple[int, ...], np.ndarray] = {}
    fp = flatten(replace(problem, edge_costs=tuple(first.setdefault(m.shape, m) for m in problem.edge_costs)))
    start, entries = fp.shared_matrices
    sizes = fp.sizes()
    blocks = {fp.mat[fp.moff[e]:fp.moff[e + 1]].tobytes() for e in range(fp.m)}
    assert len(entries) == sum(len(block) // 8 for block in blocks)
    for e in range(fp.m):
        size = int(sizes[fp.eu[e]] * sizes[fp.ev[e]])
        assert np.array_equal(entries[start[e]:start[e] + size], fp.mat[fp.moff[e]:fp.moff[e + 1]])
