"""Relinking the best solution with a relaxation decode, and the subgradient steps on the memory rows."""

import numpy as np
import pytest

from autoshard.solver.flat import flatten
from autoshard.solver.heuristic import smallest_usage
from autoshard.solver.lagrange import Relaxation, StepLength
from autoshard.solver.search import Search
from support.solver_problems import flat_assignments, random_problem


@pytest.mark.parametrize("seed", range(10))
def test_relink_finds_the_best_fitting_mix_of_the_two_assignments(seed):
    fp = flatten(random_problem(600 + seed, limited=True))
    rng = np.random.default_rng(seed)
    start = smallest_usage(fp)  # fits whenever anything fits, and random_problem's limits let it
    other = np.array([rng.integers(s) for s in fp.sizes()])
    search = Search(fp, start, seed)
    change = search.relink(other, time_limit_s=5, workers=1, deterministic_time=5.0)
    differ = start != other
    mixes = [y for y in flat_assignments(fp) if np.all(y[~differ] == start[~differ]) and fp.fits(y)]
    best_mix = min(fp.objective(y) for y in mixes)
    assert fp.fits(search.best_x)
    assert search.best_obj == pytest.approx(min(best_mix, fp.objective(start)))
    assert change == pytest.approx(search.best_obj - fp.objective(start))
    assert np.all(search.best_x[~differ] == start[~differ])


def test_relink_with_itself_changes_nothing():
    fp = flatten(random_problem(650, limited=True))
    start = smallest_usage(fp)
    search = Search(fp, start, 0)
    assert search.relink(start.copy(), time_limit_s=1, workers=1) == 0.0
    assert np.array_equal(search.best_x, start)


def test_subgradient_step_raises_overloaded_rows_and_lowers_loose_ones():
    fp = flatten(random_problem(601, limited=True))
    relaxation = Relaxation(fp)
    relaxation.lam[:] = 1.0
    slack = np.where(np.arange(fp.num_rows) % 2 == 0, 5, -3)
    relaxation.step_towards(slack, bound=10.0, target=20.0, theta=1.0)
    norm = float(slack @ slack)
    assert np.allclose(relaxation.lam, np.maximum(0.0, 1.0 + 10.0 / norm * slack))
    before = relaxation.lam.copy()
    relaxation.step_towards(slack, bound=20.0, target=20.0, theta=1.0)  # bound at the target: no step
    assert np.array_equal(relaxation.lam, before)


def test_step_length_halves_when_the_bound_stalls_and_takes_back_the_best_multipliers_after_a_collapse():
    fp = flatten(random_problem(601, limited=True))
    relaxation = Relaxation(fp)
    step = StepLength(relaxation, patience=2)
    relaxation.lam[:] = 3.0
    assert step.after(bound=90.0, target=100.0) == 1.0
    relaxation.lam[:] = 4.0
    assert step.after(bound=89.0, target=100.0) == 1.0
    assert step.after(bound=89.0, target=100.0) == 0.5  # two rounds without a better bound
    relaxation.lam[:] = 9.0
    assert step.after(bound=70.0, target=100.0) == 0.0  # fell more than the gap below the best
    assert np.all(relaxation.lam == 3.0) and step.theta == 0.25


@pytest.mark.parametrize("seed", range(6))
def test_on_rows_is_the_best_assignment_under_the_kept_rows_and_its_bound_holds_for_all(seed):
    with_rows = (flatten(random_problem(640 + 20 * seed + k, limited=True)) for k in range(20))
    fp = next(fp for fp in with_rows if fp.num_rows >= 2)
    keep = np.arange(fp.num_rows) % 2 == 0
    search = Search(fp, smallest_usage(fp), seed)
    result = search.on_rows(keep, time_limit_s=10, workers=1, deterministic_time=10.0)
    y, bound = result.x, result.bound
    assignments = list(flat_assignments(fp))
    under_kept = min(fp.objective(x) for x in assignments if np.all((fp.row_load(x) <= fp.cap)[keep]))
    optimum = min(fp.objective(x) for x in assignments if fp.fits(x))
    assert np.all((fp.row_load(y) <= fp.cap)[keep])
    assert fp.objective(y) == pytest.approx(under_kept)
    assert bound <= under_kept + 1e-6 <= optimum + 1e-6
    assert np.array_equal(search.best_x, smallest_usage(fp))  # the caller decides what to keep
