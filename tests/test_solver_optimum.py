"""Solvers against exhaustive enumeration on random small problems; bounds never above the optimum."""


import numpy as np
import pytest

from autoshard.solver import Problem, score, solve
from autoshard.solver.exact import solve_exact
from autoshard.solver.flat import flatten
from autoshard.solver.lagrange import Relaxation
from support.solver_problems import enumerate_optimum, random_problem


@pytest.mark.parametrize("limited", [False, True])
def test_exact_model_matches_enumeration(limited):
    for seed in range(25):
        problem = random_problem(seed, limited, forbidden=seed % 3 == 0)
        expected = enumerate_optimum(problem)
        fp = flatten(problem)
        result = solve_exact(fp, time_limit_s=10, workers=1, seed=0, deterministic_time=5.0)
        if expected is None:
            assert result.x is None or score(problem, fp.to_original(result.x)).forbidden > 0
            continue
        assert result.optimal
        assert score(problem, fp.to_original(result.x)).cost == expected, seed


@pytest.mark.parametrize("limited", [False, True])
def test_solve_matches_enumeration_and_bounds_hold(limited):
    for seed in range(100, 115):
        problem = random_problem(seed, limited)
        expected = enumerate_optimum(problem)
        result = solve(problem, time_limit_s=5, seed=1, deterministic=True)
        assert result.feasible
        assert result.cost == expected, seed
        assert result.lower_bound <= expected
        assert result.status == "optimal" and result.gap == 0.0


def test_relaxation_bound_never_exceeds_optimum():
    for seed in range(200, 230):
        problem = random_problem(seed, limited=seed % 2 == 0)
        expected = enumerate_optimum(problem)
        relaxation = Relaxation(flatten(problem))
        for round_no in range(6):
            relaxation.run(5)
            assert relaxation.bound() <= expected + 1e-6, (seed, round_no)
            relaxation.lam += 0.5  # any multipliers >= 0 give a valid bound
            assert relaxation.bound() <= expected + 1e-6, (seed, round_no)


def test_deterministic_solve_repeats_itself():
    problem = random_problem(7, limited=True)
    first = solve(problem, time_limit_s=5, seed=3, deterministic=True)
    second = solve(problem, time_limit_s=5, seed=3, deterministic=True)
    assert first.solution == second.solution and first.lower_bound == second.lower_bound


@pytest.mark.parametrize("scale", [1, 10**6, 10**9, 10**12])
def test_proved_optimal_at_any_cost_scale(scale):
    """Independent nodes: the relaxation's bound is the optimum. Whether the heuristic's bound
    closes the gap or CP-SAT proves it, the answer is optimal with the bound equal to the cost,
    never a bound above it."""
    costs = tuple(np.array([3, 5, 7]) * scale + i for i in range(4))
    usages = tuple(np.array([0, 1, 2]) for _ in range(4))
    problem = Problem(costs, usages, np.array([[i, i + 1] for i in range(4)]), np.zeros((0, 2)), (), None)
    result = solve(problem, time_limit_s=2, deterministic=True)
    assert result.solution == (0, 0, 0, 0)
    assert result.status == "optimal" and result.lower_bound == result.cost == 12 * scale + 6 and result.gap == 0.0
