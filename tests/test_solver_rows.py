"""Memory rows that cannot bind are dropped from the working form; the ones that can stay and hold."""

import importlib
import itertools
import math

import numpy as np
import pytest

from autoshard.solver import Problem, score, solve
from autoshard.solver import exact as exact_module
from autoshard.solver.exact import solve_exact
from autoshard.solver.flat import flatten
from support.solver_problems import enumerate_optimum, random_problem

solve_module = importlib.import_module("autoshard.solver.solve")


def two_steps(limit: int) -> Problem:
    """Node a lives at steps 0-1, b at step 0, c at step 1. The cheap strategies use the most memory.

    Step 0 holds at most a 10 + b 5 = 15; step 1 up to a 10 + c 50 = 60."""
    costs = (np.array([0, 7]), np.array([0, 3]), np.array([0, 40]))
    usages = (np.array([10, 1]), np.array([5, 0]), np.array([50, 0]))
    intervals = np.array([[0, 2], [0, 1], [1, 2]])
    return Problem(costs, usages, intervals, np.array([[0, 1], [0, 2]]),
                   (np.array([[0, 1], [1, 0]]), np.array([[0, 2], [2, 0]])), usage_limit=limit)


def test_a_row_that_cannot_bind_is_dropped_and_one_that_can_is_kept():
    fp = flatten(two_steps(limit=30))
    # Step 0 can hold at most 15 <= 30: dropped. Step 1 can reach 60 > 30: kept, with
    # capacity 30 minus a's smallest usage 1.
    assert fp.row_steps.tolist() == [1] and fp.cap.tolist() == [29]
    assert (fp.r0.tolist(), fp.r1.tolist()) == ([0, 0, 0], [1, 0, 1])  # b never binds: an empty range


def test_the_kept_row_still_holds_the_budget():
    problem = two_steps(limit=30)
    result = solve(problem, time_limit_s=5, deterministic=True)
    # a=0, c=0 would need 60 at step 1; the cheapest that fits moves c to its small strategy.
    assert result.status == "optimal" and result.cost == enumerate_optimum(problem) == 42
    assert result.solution == (0, 0, 1) and score(problem, list(result.solution)).peak_usage == 15
    exact = solve_exact(flatten(problem), time_limit_s=5, deterministic_time=5.0)
    assert exact.optimal and flatten(problem).objective(exact.x) == 42


def test_with_room_for_everything_no_row_is_left():
    fp = flatten(two_steps(limit=80))
    assert fp.num_rows == 0 and np.all(fp.r0 == fp.r1)
    assert solve(two_steps(limit=80), time_limit_s=5, deterministic=True).cost == 0


def test_a_row_inside_its_neighbour_with_no_smaller_capacity_is_dropped():
    # Steps 0 and 1 are both maximal (z lives only at 0, b only at 1) and either can overflow
    # (a alone can use 12 > 10), but z never changes its usage: what can vary at step 0 (a) is
    # inside what can vary at step 1 (a and b), with the same capacity, so step 1 implies step 0.
    costs = (np.array([0, 5]), np.array([0, 5]), np.array([0]))
    usages = (np.array([12, 0]), np.array([9, 0]), np.array([0]))
    problem = Problem(costs, usages, np.array([[0, 2], [1, 2], [0, 1]]), np.zeros((0, 2)), (), usage_limit=10)
    fp = flatten(problem)
    assert fp.row_steps.tolist() == [1] and fp.cap.tolist() == [10]
    # A fixed load at step 0 lowers its capacity below step 1's: then both rows stay.
    tighter = Problem(costs, usages[:2] + (np.array([2]),), problem.intervals, np.zeros((0, 2)), (), usage_limit=10)
    assert flatten(tighter).row_steps.tolist() == [0, 1]
    assert solve(tighter, time_limit_s=5, deterministic=True).cost == enumerate_optimum(tighter) == 5


def staircase(seed: int) -> Problem:
    """Nested and overlapping lifetimes with fixed loads and a limit near the least peak: rows of
    every kind (never binding, dominated, binding)."""
    rng = np.random.default_rng(seed)
    n = 7
    sizes = rng.integers(1, 4, n)
    costs = tuple(rng.integers(0, 30, s) for s in sizes)
    usages = tuple(rng.integers(0, 12, s) for s in sizes)
    starts = rng.integers(0, 6, n)
    intervals = np.stack([starts, starts + rng.integers(1, 6, n)], axis=1)
    least = np.zeros(12, dtype=np.int64)
    for (a, b), u in zip(intervals, usages):
        least[a:b] += u.min()
    edges = [[i, i + 1] for i in range(n - 1)]
    matrices = tuple(rng.integers(0, 20, (sizes[i], sizes[i + 1])) for i in range(n - 1))
    return Problem(costs, usages, intervals, edges, matrices, usage_limit=int(least.max() + rng.integers(0, 20)))


@pytest.mark.parametrize("seed", range(20))
def test_pruned_rows_decide_feasibility_exactly(seed):
    problem = staircase(seed)
    fp = flatten(problem)
    assert np.all(fp.r0 <= fp.r1) and np.all(fp.r1 <= fp.num_rows)
    for x in itertools.product(*(range(s) for s in fp.sizes())):
        assert fp.fits(np.array(x)) == score(problem, fp.to_original(np.array(x))).feasible, x


def test_memory_rows_with_too_many_terms_leave_the_problem_to_the_heuristic(monkeypatch):
    problem = two_steps(limit=30)
    assert exact_module.row_terms(flatten(problem)) == 2  # a's and c's large strategies, on the one row
    assert solve(problem, time_limit_s=5, deterministic=True).stats["method"] == "cp-sat"
    monkeypatch.setattr(exact_module, "EXACT_TERM_LIMIT", 1)
    result = solve(problem, time_limit_s=5, deterministic=True)
    assert result.stats["method"] == "heuristic" and "cp_sat_status" not in result.stats
    assert result.cost == 42


def test_cp_sat_that_finds_nothing_gives_its_time_back_to_the_heuristic(monkeypatch):
    problem = random_problem(0, limited=True)  # the first heuristic run cannot prove its answer optimal
    seen = {}

    def finds_nothing(fp, *, time_limit_s, give_up_s, **_):
        seen["give_up_s"], seen["time_limit_s"] = give_up_s, time_limit_s
        return exact_module.ExactResult(None, -math.inf, False, False, 0.01, "UNKNOWN")

    monkeypatch.setattr(solve_module, "solve_exact", finds_nothing)
    result = solve(problem, time_limit_s=2.0, workers=1)
    assert seen["give_up_s"] == pytest.approx(solve_module.EXACT_GIVE_UP_SHARE * seen["time_limit_s"])
    assert result.stats["cp_sat_status"] == "UNKNOWN" and "heuristic_after_cp_sat" in result.stats
    assert result.feasible and result.cost == score(problem, list(result.solution)).cost
    assert result.cost == enumerate_optimum(problem)
