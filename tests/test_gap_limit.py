"""A relative gap limit stops the solvers once the answer is certified close enough; 0 proves optimality."""

import numpy as np
import pytest

from autoshard.cli.main import main
from autoshard.solver import solve
from autoshard.solver.exact import solve_exact
from autoshard.solver.flat import flatten
from service.inputs import canonical_plan_request, plan_inputs
from service.schemas import PlanRequest
from support.cli import plan_args
from support.service import MLP, error_of, settings_for
from support.solver_problems import frustrated_ring


OPTIMUM = 203  # above 7 * base


def test_the_heuristic_stops_within_the_gap_limit_and_zero_goes_on_to_prove():
    problem = frustrated_ring(base=10**5)
    close = solve(problem, time_limit_s=5, deterministic=True, gap_limit=1e-2)
    assert close.stats["method"] == "heuristic" and close.status == "feasible"
    assert 0 < close.gap <= 1e-3 and close.lower_bound < close.cost
    proved = solve(problem, time_limit_s=5, deterministic=True)
    assert proved.stats["method"] == "cp-sat" and proved.status == "optimal"
    assert proved.cost == proved.lower_bound == 7 * 10**5 + OPTIMUM <= close.cost


def test_cp_sat_counts_the_offset_in_its_relative_gap():
    # The model's objective leaves out the 7 * 10**6 every answer pays: relative to what is left
    # (a few hundred) no answer short of the optimum is within 1e-4, relative to the true cost
    # the first one found that is stops the search.
    fp = flatten(frustrated_ring(base=10**6))
    worst = np.zeros(fp.n, dtype=np.int64)  # every edge pays
    stopped = solve_exact(fp, time_limit_s=5, deterministic_time=5.0, hint=worst, gap_limit=1e-4)
    cost = fp.objective(stopped.x)
    assert not stopped.optimal and stopped.bound < 7 * 10**6 + OPTIMUM < cost
    assert (cost - stopped.bound) / cost <= 1e-4
    proved = solve_exact(fp, time_limit_s=5, deterministic_time=5.0, hint=worst)
    assert proved.optimal and fp.objective(proved.x) == proved.bound == 7 * 10**6 + OPTIMUM


@pytest.mark.parametrize("value", [-0.5, 1.0])
def test_solve_rejects_a_gap_limit_outside_zero_to_one(value):
    with pytest.raises(ValueError, match="gap_limit"):
        solve(frustrated_ring(1), time_limit_s=1, gap_limit=value)


@pytest.mark.parametrize("value", ["1", "-0.01", "nan", "inf"])
def test_plan_names_a_bad_gap_limit_with_the_other_flag_problems(tmp_path, capsys, value):
    assert main(plan_args(tmp_path, "--gap-limit", value, "--workers", "0")) == 2
    err = capsys.readouterr().err
    assert "--gap-limit: must be a number in [0, 1)" in err and "--workers: " in err and "Traceback" not in err


def test_the_service_takes_a_gap_limit_in_zero_to_one(http, tmp_path):
    response = http.post("/v1/plans", json={"graph": MLP, "mesh": "dp=2", "options": {"gap_limit": 1}})
    assert response.status_code == 422
    problems = error_of(response)["problems"]
    assert any(p["where"] == "/options/gap_limit" and "less than 1" in p["message"] for p in problems), problems
    for options, expected in (({}, 1e-4), ({"gap_limit": 0}, 0.0)):
        request = PlanRequest(graph=MLP, mesh="dp=2", options=options).model_dump(mode="json")
        canonical = canonical_plan_request(request, settings_for(tmp_path))
        assert plan_inputs(canonical).settings.gap_limit == expected
