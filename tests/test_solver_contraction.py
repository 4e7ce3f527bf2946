"""Nodes tied by one-to-one edges: merged for the relaxation, relinked group by group."""

import itertools
from dataclasses import replace

import numpy as np
import pytest

from autoshard.solver import contraction, group_relink
from autoshard.solver.contraction import contract
from autoshard.solver.first_plan import low_memory_labelling, merged_memory_problem
from autoshard.solver.flat import FORBIDDEN, flatten
from autoshard.solver.group_relink import relink_groups
from autoshard.solver.heuristic import HeuristicRun
from autoshard.solver.lagrange import Relaxation
from autoshard.solver.problem import FORBIDDEN_COST, Problem
from autoshard.solver.schedule import SCHEDULE
from support.solver_problems import flat_assignments


@pytest.fixture(autouse=True)
def merge_any_tie(monkeypatch):
    """These problems are small: merge whatever is tied, however few nodes that removes."""
    monkeypatch.setattr(contraction, "MERGED_NODES_AT_MOST", 1.0)


def tied_problem(seed: int, limit_share: float = 0.6, nodes: tuple[int, int] = (5, 8)) -> Problem:
    """Nodes of three strategies; random one-to-one edges (allowed entries a permutation, every
    other entry forbidden) tie some of them into groups, cycles included; ordinary edges and a
    memory limit between the smallest and largest peak."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(*nodes))
    costs = [rng.integers(0, 50, 3) for _ in range(n)]
    usages = [rng.integers(0, 20, 3) for _ in range(n)]
    starts = rng.integers(0, 6, n)
    intervals = np.stack([starts, starts + rng.integers(1, 5, n)], axis=1)
    edges, matrices = [], []
    for _ in range(int(rng.integers(2, n))):
        u, v = (int(a) for a in rng.choice(n, 2, replace=False))
        matrix = np.full((3, 3), FORBIDDEN_COST, dtype=np.int64)
        matrix[np.arange(3), rng.permutation(3)] = rng.integers(0, 30, 3)
        edges.append((u, v))
        matrices.append(matrix)
    for _ in range(int(rng.integers(1, 2 * n))):
        u, v = (int(a) for a in rng.choice(n, 2, replace=False))
        edges.append((u, v))
        matrices.append(rng.integers(0, 40, (3, 3)))
    peak_low = sum(int(u.min()) for u in usages)
    peak_high = sum(int(u.max()) for u in usages)
    return Problem(tuple(costs), tuple(usages), intervals, np.array(edges), tuple(matrices),
                   usage_limit=int(peak_low + limit_share * (peak_high - peak_low)))


def allowed(fp, x) -> bool:
    return fp.objective(x) < FORBIDDEN and fp.fits(x)


@pytest.mark.parametrize("seed", range(12))
def test_merged_answers_expand_to_original_answers_of_the_same_cost_and_penalties(seed):
    fp = flatten(tied_problem(seed))
    merged = contract(fp)
    assert merged is not None and merged.fp.n < fp.n
    pen = np.random.default_rng(seed).random(fp.n)
    penalised = merged.penalised_costs(pen)
    for y in flat_assignments(merged.fp):
        x = merged.expand(y)
        edge_part = merged.fp.objective(y) - merged.fp.cost[merged.fp.soff[:-1] + y].sum()
        if merged.fp.objective(y) < FORBIDDEN:
            assert fp.objective(x) == merged.fp.objective(y)
            assert penalised[merged.fp.soff[:-1] + y].sum() + edge_part == pytest.approx(
                fp.objective(x) + pen @ fp.use[fp.soff[:-1] + x])
    # Every original answer that chooses nothing forbidden is the expansion of a merged one.
    reachable = {merged.expand(y).tobytes() for y in flat_assignments(merged.fp)}
    for x in flat_assignments(fp):
        if fp.objective(x) < FORBIDDEN:
            assert x.tobytes() in reachable


@pytest.mark.parametrize("seed", range(12))
def test_merged_relaxation_bounds_the_optimum_and_decodes_nothing_forbidden(seed):
    fp = flatten(tied_problem(seed))
    optimum = min((fp.objective(x) for x in flat_assignments(fp) if allowed(fp, x)), default=None)
    some_allowed = any(fp.objective(x) < FORBIDDEN for x in flat_assignments(fp))
    relaxation = Relaxation(fp, merge=True)
    assert relaxation.contraction is not None
    rng = np.random.default_rng(seed)
    for _ in range(3):
        x = relaxation.run(10)
        # Merged groups cannot break their one-to-one edges, and no other edge forbids anything.
        assert (fp.objective(x) < FORBIDDEN) == some_allowed
        if optimum is not None:
            assert relaxation.bound() <= optimum + 1e-6
        relaxation.lam = rng.random(fp.num_rows) * 3.0


def test_a_merge_that_would_remove_few_nodes_is_declined(monkeypatch):
    fp = flatten(tied_problem(0))
    merged = contract(fp)
    monkeypatch.setattr(contraction, "MERGED_NODES_AT_MOST", (merged.fp.n - 0.5) / fp.n)
    assert contract(fp) is None
    monkeypatch.setattr(contraction, "MERGED_NODES_AT_MOST", (merged.fp.n + 0.5) / fp.n)
    assert contract(fp).fp.n == merged.fp.n


def test_without_one_to_one_edges_nothing_is_merged():
    problem = Problem((np.array([1, 2]), np.array([3, 1])), (np.array([1, 0]), np.array([0, 2])),
                      np.array([[0, 2], [1, 3]]), np.array([[0, 1]]), (np.array([[0, 5], [5, 0]]),), usage_limit=2)
    fp = flatten(problem)
    assert contract(fp) is None
    assert Relaxation(fp, merge=True).contraction is None


@pytest.mark.parametrize("seed", range(20))
def test_group_relink_finds_the_cheapest_fitting_mix_by_group(seed):
    fp = flatten(tied_problem(100 + seed, limit_share=0.4, nodes=(8, 10)))
    merged = contract(fp)
    answers = [merged.expand(y) for y in flat_assignments(merged.fp) if merged.fp.objective(y) < FORBIDDEN]
    fitting = [x for x in answers if fp.fits(x)]
    if not fitting:
        pytest.skip("no answer fits")
    rng = np.random.default_rng(seed)
    best = max(fitting, key=fp.objective)  # the dearest that fits: a mix can improve on it
    other = answers[int(rng.integers(len(answers)))]
    differing = np.unique(merged.group[best != other])
    mixes = []
    for take in itertools.product((False, True), repeat=len(differing)):
        x = best.copy()
        switched = np.isin(merged.group, differing[np.array(take, dtype=bool)])
        x[switched] = other[switched]
        if allowed(fp, x):
            mixes.append(fp.objective(x))
    mixed = relink_groups(fp, merged.group, best, other, 5.0, 0, deterministic_time=5.0)
    if min(mixes) < fp.objective(best):
        assert mixed is not None and allowed(fp, mixed)
        assert fp.objective(mixed) == min(mixes)
    else:
        assert mixed is None


@pytest.mark.parametrize(("limit", "expected"), [(None, [1, 1]), (3, None)])
def test_group_relink_prices_the_pair_of_switches_together(limit, expected):
    # Either switch alone costs 10 more on the edge, both together 10 less; both need 4 units.
    problem = Problem((np.array([0, 0]), np.array([0, 0])), (np.array([0, 2]), np.array([0, 2])),
                      np.array([[0, 1], [0, 1]]), np.array([[0, 1]]), (np.array([[10, 20], [20, 0]]),),
                      usage_limit=limit)
    fp = flatten(problem)
    mixed = relink_groups(fp, np.arange(2), np.array([0, 0]), np.array([1, 1]), 5.0, 0, deterministic_time=5.0)
    if expected is None:
        assert mixed is None
    else:
        assert mixed.tolist() == expected


def must_agree_star(leaves: int) -> Problem:
    """A hub whose leaves must agree with it (each pair one-to-one), all live at one step within a
    limit of one unit: strategy 0 is free but uses a unit at every leaf, strategy 1 costs 5 and
    uses a unit at the hub only, so the only plan that fits is all 1."""
    n = leaves + 1
    agree = np.array([[0, FORBIDDEN_COST], [FORBIDDEN_COST, 0]])
    return Problem(tuple(np.array([0, 5]) for _ in range(n)), (np.array([0, 1]),) + (np.array([1, 0]),) * leaves,
                   np.array([[0, 1]] * n), np.array([[0, leaf] for leaf in range(1, n)]), (agree,) * leaves,
                   usage_limit=1)


def test_the_merged_labelling_turns_the_whole_group_in_one_pass():
    fp = flatten(must_agree_star(60))
    merged = contract(fp)
    assert merged_memory_problem(merged).n == 1
    x = low_memory_labelling(fp, seed=0, passes=1, moves_per_centre=0, block=1, contraction=merged)
    assert x.tolist() == [1] * fp.n and fp.fits(x)


@pytest.mark.parametrize("raises", [0, 30])
def test_a_round_on_merged_groups_raises_the_multipliers_until_a_decode_fits(raises):
    fp = flatten(must_agree_star(8))
    run = HeuristicRun(fp, time_limit_s=10.0, seed=0, hint=None, progress=None, deterministic=True, gap_limit=0.0,
                       workers=1, schedule=replace(SCHEDULE, merged_raises=raises))
    assert run.relaxation.contraction is not None
    assert not fp.fits(run.relaxation.run(5))  # free but overloaded: every leaf at strategy 0
    run._raise_until_fit(unit=1e-3)
    assert fp.fits(run.relaxation.run(5)) == (raises > 0)


def test_group_relink_declines_answers_too_far_apart(monkeypatch):
    fp = flatten(must_agree_star(3))
    best, other = np.zeros(fp.n, dtype=np.int64), np.ones(fp.n, dtype=np.int64)
    group = np.arange(fp.n)  # every node its own group: four differ, over one row
    monkeypatch.setattr(group_relink, "TABLE_LIMIT", 3)
    assert not group_relink.groups_fit(fp, group, best, other)
    assert relink_groups(fp, group, best, other, 1.0, 0, deterministic_time=1.0) is None
    monkeypatch.setattr(group_relink, "TABLE_LIMIT", 4)
    assert group_relink.groups_fit(fp, group, best, other)
