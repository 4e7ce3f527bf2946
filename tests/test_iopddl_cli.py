"""`autoshard iopddl`: solve, write, score the written answer; input errors exit 2."""

import json
from pathlib import Path

from autoshard.cli.main import main

EXAMPLE = Path(__file__).parent / "data" / "iopddl_example.json"


def test_solve_then_score_round_trip(tmp_path, capsys):
    out = tmp_path / "solution.json"
    assert main(["iopddl", str(EXAMPLE), "--time-limit", "5", "--seed", "1", "-o", str(out), "-q"]) == 0
    answer = json.loads(out.read_text())
    assert answer["cost"] == 445 and answer["lower_bound"] == 445 and answer["feasible"] is True
    assert main(["iopddl", "--score", str(EXAMPLE), str(out)]) == 0
    scored = json.loads(capsys.readouterr().out)
    assert scored["cost"] == 445 and scored["feasible"] is True and scored["peak_usage"] <= scored["usage_limit"]


def test_score_reports_an_infeasible_solution(tmp_path, capsys):
    solution = tmp_path / "s.json"
    solution.write_text("[0, 1, 1, 1, 0]")
    assert main(["iopddl", "--score", str(EXAMPLE), str(solution)]) == 0
    scored = json.loads(capsys.readouterr().out)
    assert (scored["cost"], scored["feasible"], scored["violated_steps"]) == (505, False, 20)


def test_input_errors_exit_2(tmp_path, capsys):
    solution = tmp_path / "s.json"
    solution.write_text('{"solution": [0, 9, 0, 0, 0]}')
    assert main(["iopddl", "--score", str(EXAMPLE), str(solution)]) == 2
    assert "/solution/1" in capsys.readouterr().err
    assert main(["iopddl", str(tmp_path / "missing.json")]) == 2
    assert main(["iopddl", "--score", str(EXAMPLE)]) == 2
