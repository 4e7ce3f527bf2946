"""`plan.json`'s `phases`: the wall time and peak memory of every phase of `autoshard plan`, which
together account for the command's wall time; a long phase is announced on stderr."""

from __future__ import annotations

import json
import time

from autoshard import phases as phases_module
from autoshard.cli.main import main
from autoshard.models import GPTConfig, gpt
from autoshard.phases import PhaseTimes

PHASES = ["load", "kernel_compilation", "formulate", "solve", "pricing", "partition", "collective_optimizations",
          "verification", "ir_emission", "writing"]


def test_plan_json_carries_every_phase_and_they_sum_to_the_wall_time(tmp_path, capsys):
    graph = tmp_path / "gpt.json"
    graph.write_text(json.dumps(gpt(GPTConfig(layers=2, hidden=256, heads=4, seq=128, batch=4, vocab=1000),
                                    training=True)))
    started = time.perf_counter()
    assert main(["plan", str(graph), "--mesh", "dp=2,tp=2", "--topology", "dgx-h100", "--time-limit", "3",
                 "--emit", "annotated,partitioned", "--verify", "always", "-o", str(tmp_path / "out")]) == 0
    wall_s = time.perf_counter() - started
    text = (tmp_path / "out" / "plan.json").read_text()
    document = json.loads(text)
    phases = document["phases"]
    assert list(phases) == PHASES and list(document)[-1] == "phases"
    # one line per op, per resharding and per phase, each a whole JSON value
    lines = text.splitlines()
    for section in ("ops", "reshardings", "phases"):
        start = lines.index(f' "{section}": ' + ("[" if section == "reshardings" else "{"))
        entries = lines[start + 1:start + 1 + len(document[section])]
        assert all(json.loads("{" + line.strip().rstrip(",") + "}") if section != "reshardings"
                   else json.loads(line.strip().rstrip(",")) for line in entries)
        assert lines[start + 1 + len(document[section])].strip() in ("}", "]", "},", "],")
    assert all(entry["wall_s"] >= 0 and entry["peak_rss_bytes"] > 2 ** 20 for entry in phases.values())
    total = sum(entry["wall_s"] for entry in phases.values())
    assert 0.9 * wall_s <= total <= wall_s
    # the solver's own keys keep their meaning next to the phases
    assert abs(document["solver"]["formulate_s"] - phases["formulate"]["wall_s"]) < 0.05


def test_a_long_phase_is_announced_while_it_runs_and_when_it_ends(monkeypatch):
    monkeypatch.setattr(phases_module, "LONG_PHASE_S", 0.05)
    monkeypatch.setattr(phases_module, "REPEAT_S", 0.05)
    heard: list[str] = []
    recorder = PhaseTimes(announce=heard.append)
    with recorder.phase("formulate"):
        time.sleep(0.2)
    with recorder.phase("solve", reports_itself=True):
        time.sleep(0.2)
    with recorder.phase("load"):
        pass
    assert any(line.startswith("formulate: ") and line.endswith("so far") for line in heard)
    assert not any(line.startswith("solve: ") and line.endswith("so far") for line in heard)
    assert [line.split(":")[0] for line in heard if "resident" in line] == ["formulate", "solve"]
    assert list(recorder.to_json()) == ["formulate", "solve", "load"]
    assert recorder.to_json()["formulate"]["wall_s"] >= 0.2


def test_the_solvers_one_off_compilation_is_a_phase_of_its_own_before_formulating(monkeypatch):
    """numba's first compilation (about 25 s after an install) is announced as itself when long and
    is neither formulate_s nor solve_s: it runs before either starts."""
    import autoshard.planning.make_plan as make_plan_module
    from autoshard import Mesh, bind_hardware, load_graph
    from autoshard.planning.make_plan import SolveSettings, make_plan

    recorder = PhaseTimes()
    ended_before = []
    monkeypatch.setattr(make_plan_module, "compile_kernels", lambda: ended_before.append(list(recorder.entries)))
    mesh = Mesh.parse("dp=2,tp=2")
    make_plan(load_graph("examples/mlp.json", mesh), mesh, bind_hardware("dgx-h100", mesh),
              SolveSettings(deterministic=True), phases=recorder)
    assert ended_before == [[]]
    assert list(recorder.to_json()) == ["kernel_compilation", "formulate", "solve", "pricing"]
