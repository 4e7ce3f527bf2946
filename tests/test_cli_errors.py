"""What a user gets for input the CLI cannot take, and for a bug: a clear answer, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoshard.cli import validate as validate_command
from autoshard.cli.main import INTERNAL_ERROR, main


@pytest.mark.parametrize("content, expected", [
    (b"\xff\xfe{}", "not UTF-8 text: byte 0 is 0xff"),
    (b"[" * 100_000 + b"]" * 100_000, "JSON nested too deeply"),
    (b'{"format": "autoshard.graph/v1", "tensors": {}, "ops": [], "format": "x"}',
     "the key 'format' appears twice in one object"),
])
def test_a_file_that_is_not_a_readable_json_document_is_named_with_the_reason(tmp_path, capsys, content, expected):
    path = tmp_path / "graph.json"
    path.write_bytes(content)
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: " in err and expected in err and "Traceback" not in err


def test_a_bug_exits_4_with_one_line_and_the_traceback_in_a_report(tmp_path, capsys, monkeypatch):
    def broken(args):
        raise ZeroDivisionError("division by zero")
    monkeypatch.setattr(validate_command, "run", broken)
    assert main(["validate", "examples/mlp.json"]) == INTERNAL_ERROR == 4
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "internal error, a bug in autoshard (ZeroDivisionError: division by zero)" in line
    report = Path(line.rsplit("the full report is in ", 1)[1])
    text = report.read_text()
    report.unlink()
    assert "Traceback" in text and "raise ZeroDivisionError" in text and "'validate'" in text


@pytest.mark.parametrize("command", [
    ["plan", "examples/mlp.json", "--mesh", "dp=2,tp=4", "--topology", "dgx-h100"],
    ["iopddl", str(Path(__file__).parent / "data" / "iopddl_example.json")],
])
def test_a_seed_beyond_64_bits_is_refused_at_the_door(capsys, command):
    assert main(command + ["--seed", str(2 ** 64)]) == 2
    err = capsys.readouterr().err
    assert "--seed: must be in [0, 2**63 - 1], " in err and "Traceback" not in err


def test_the_python_api_and_the_service_refuse_the_same_seeds():
    from pydantic import ValidationError

    from autoshard.errors import InputError
    from autoshard.planning.make_plan import SolveSettings
    from service.schemas import PlanOptions
    assert SolveSettings(seed=2 ** 63 - 1).seed == 2 ** 63 - 1
    with pytest.raises(InputError) as error:
        SolveSettings(seed=2 ** 63)
    assert error.value.problems[0].where == "seed"
    with pytest.raises(ValidationError):
        PlanOptions(seed=2 ** 63)


def test_weights_that_make_every_plan_cost_nothing_are_refused(capsys):
    from pydantic import ValidationError

    from autoshard.errors import InputError
    from autoshard.planning.formulation import Weights
    from autoshard.planning.make_plan import SolveSettings
    from service.schemas import Weights as WireWeights
    assert main(["plan", "examples/mlp.json", "--mesh", "dp=2,tp=4", "--topology", "dgx-h100",
                 "--weights", "time=0"]) == 2
    assert "--weights: every weight is 0, so every plan would cost nothing" in capsys.readouterr().err
    with pytest.raises(InputError, match="every weight is 0"):
        SolveSettings(weights=Weights(time=0.0))
    with pytest.raises(ValidationError, match="every weight is 0"):
        WireWeights(time=0.0)
    assert Weights(time=0.0, comm_s_per_byte=1e-11).comm_s_per_byte == 1e-11


def test_estimate_refuses_a_plan_made_for_another_mesh(tmp_path, capsys):
    out = tmp_path / "planned"
    assert main(["plan", "examples/mlp.json", "--mesh", "dp=2,tp=4", "--topology", "dgx-h100", "--deterministic",
                 "--verify", "never", "-o", str(out)]) == 0
    capsys.readouterr()
    estimate = ["estimate", "examples/mlp.json", "--topology", "dgx-h100", "--plan", str(out / "plan.json")]
    assert main(estimate + ["--mesh", "dp=4,tp=2"]) == 2
    assert "--mesh: the plan was made for mesh dp=2,tp=4, not dp=4,tp=2" in capsys.readouterr().err
    assert main(estimate + ["--mesh", "dp=2,tp=4"]) == 0


def test_a_mesh_beyond_a_million_devices_is_refused_at_once(capsys):
    from autoshard.errors import InputError
    from autoshard.mesh import MAX_DEVICES, Mesh
    assert main(["plan", "examples/mlp.json", "--mesh", "dp=65536,tp=65536", "--topology", "dgx-h100"]) == 2
    assert "--mesh: 4294967296 devices, over the limit of 1048576" in capsys.readouterr().err
    assert Mesh.of(dp=1024, tp=1024).num_devices == MAX_DEVICES
    with pytest.raises(InputError):
        Mesh.of(dp=1024, tp=1025)


def test_a_memory_budget_beyond_an_exbibyte_is_refused_by_its_own_name(capsys):
    from pydantic import ValidationError

    from autoshard.errors import InputError
    from autoshard.planning.make_plan import SolveSettings
    from service.schemas import PlanOptions
    assert main(["plan", "examples/mlp.json", "--mesh", "dp=2,tp=4", "--topology", "dgx-h100",
                 "--memory-budget", "1e30"]) == 2
    assert "--memory-budget: must be a number of bytes in (0, 2**60], got 1e+30" in capsys.readouterr().err
    with pytest.raises(InputError) as error:
        SolveSettings(memory_budget_bytes=1e30)
    assert error.value.problems[0].where == "memory_budget_bytes"
    with pytest.raises(ValidationError):
        PlanOptions(memory_budget_bytes=1e30)


def test_a_mesh_of_a_million_devices_is_planned_without_walking_its_devices(tmp_path, capsys):
    """Sizing, pricing and the verification-size estimate follow from shapes and axis sizes:
    dp=1000000 plans as a small mesh does (it spent 45 s walking devices), and the plan is not
    simulated (it would need hundreds of GiB)."""
    assert main(["plan", "examples/mlp.json", "--mesh", "dp=1000000", "--time-limit", "5",
                 "-o", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "simulator: not run" in printed and "GiB of host memory" in printed


def test_validate_refuses_an_empty_mesh_as_plan_does(tmp_path, capsys):
    assert main(["validate", "examples/mlp.json", "--mesh="]) == 2
    assert "--mesh: expected NAME=SIZE" in capsys.readouterr().err
