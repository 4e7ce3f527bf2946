"""`plan --like`: a narrow version of a model planned with a wide plan's layout decisions (mesh,
pipeline stages, schedule and virtual stages, microbatches, each virtual stage's layers, each
layer's recomputation as `--recompute auto` chose it) records the same decisions and simulates
PASS; a flag disagreeing with the plan, or a plan lacking a field, is refused by name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from autoshard.cli.main import main

SHAPE = ["--layers", "8", "--heads", "4", "--seq", "16", "--batch", "8", "--vocab", "64"]
# a stage budget below the wide plan's peak without recomputation, so auto recomputes some layers only
WIDE = ["--mesh", "tp=2", "--topology", "dgx-a100", "--pipeline", "2", "--schedule", "interleaved:2",
        "--microbatches", "4", "--recompute", "auto", "--memory-budget", "57MiB"]
FAST = ["--time-limit", "2", "--workers", "1"]


def _generate(folder: Path, hidden: int) -> Path:
    path = folder / f"gpt{hidden}.json"
    assert main(["generate", "gpt", "--training", "--precision", "bf16-mixed", "--style", "megatron", *SHAPE,
                 "--hidden", str(hidden), "-o", str(path)]) == 0
    return path


def decisions(plan: dict[str, Any]) -> dict[str, Any]:
    """What a transplant keeps: the mesh, the machine, the pipeline's shape and cut, the recomputation."""
    pipeline = plan["pipeline"]
    return {"mesh": plan["mesh"], "topology": plan["topology"], "topology_options": plan["topology_options"],
            "stages": pipeline["stage_count"], "schedule": pipeline["schedule"],
            "virtual_stages_per_stage": pipeline["virtual_stages_per_stage"], "microbatches": plan["microbatches"],
            "pipeline_microbatches": pipeline["microbatches"],
            "layers": [[chunk["layers"] for chunk in stage["chunks"]] for stage in pipeline["stages"]],
            "recompute": plan.get("recompute", "none")}


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """The wide plan (hidden 256) and the narrow one (hidden 64) planned --like it, verified always."""
    folder = tmp_path_factory.mktemp("transplant")
    wide, narrow = _generate(folder, 256), _generate(folder, 64)
    assert main(["plan", str(wide), *WIDE, *FAST, "--verify", "never", "-o", str(folder / "wide")]) == 0
    assert main(["plan", str(narrow), "--like", str(folder / "wide" / "plan.json"), *FAST, "--verify", "always",
                 "-o", str(folder / "narrow")]) == 0
    return folder, *(json.loads((folder / name / "plan.json").read_text()) for name in ("wide", "narrow"))


def test_the_narrow_plan_records_the_wide_plans_decisions(planned):
    _, wide, narrow = planned
    assert decisions(narrow) == decisions(wide)
    assert (wide["pipeline"]["stage_count"], wide["pipeline"]["virtual_stages_per_stage"], wide["microbatches"]) == (2, 2, 4)


def test_auto_chose_a_recomputation_that_the_narrow_plan_keeps_layer_by_layer(planned):
    _, wide, narrow = planned
    assert wide.get("recompute", "none") != "none"  # the budget made auto recompute
    assert narrow["recompute"] == wide["recompute"]


def test_the_narrow_plan_simulates_pass_in_the_schedules_order(planned):
    _, _, narrow = planned
    verification = narrow["verification"]
    assert verification["status"] == "passed", verification.get("summary")
    assert verification["values_checked"] > 1000
    assert len(verification["pipeline"]["ran"]) == 2


def test_a_flag_disagreeing_with_the_plan_is_refused_naming_both(planned, capsys):
    folder, _, _ = planned
    like = str(folder / "wide" / "plan.json")
    capsys.readouterr()
    assert main(["plan", str(folder / "gpt64.json"), "--like", like, "--schedule", "1f1b", "--mesh", "tp=2"]) == 2
    error = capsys.readouterr().err
    assert f"--schedule: 1f1b conflicts with --like {like}, whose /pipeline/schedule is interleaved:2" in error
    assert "--mesh" not in error  # the same mesh agrees


@pytest.mark.parametrize("field, where", [(("pipeline", "schedule"), "/pipeline/schedule"),
                                          (("mesh",), "/mesh"), (("topology",), "/topology"),
                                          (("pipeline", "stages"), "/pipeline/stages")])
def test_a_plan_lacking_a_field_is_refused_naming_it(planned, capsys, field, where):
    folder, wide, _ = planned
    broken = json.loads(json.dumps(wide))
    section = broken
    for key in field[:-1]:
        section = section[key]
    del section[field[-1]]
    path = folder / "broken.json"
    path.write_text(json.dumps(broken))
    capsys.readouterr()
    assert main(["plan", str(folder / "gpt64.json"), "--like", str(path)]) == 2
    assert f"--like {path} {where}: " in capsys.readouterr().err
