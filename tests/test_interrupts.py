"""Ctrl-C and SIGTERM: `plan` stops in any phase, writes the best plan found so far (solver status
`interrupted`) and exits 130 with one line; any other command says it was interrupted in one
line, without a traceback. Each test starts the command, waits for what it prints on entering
the phase, then sends the signal."""

from __future__ import annotations

import json
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from autoshard.cli.interrupts import INTERRUPTED
from autoshard.cli.main import main
from autoshard.solver.exact import solve_exact
from autoshard.solver.flat import flatten
from autoshard.solver.stopping import stop_running_solves
from support.solver_problems import frustrated_ring

WAIT_S = 120  # for the phase to begin and for the command to end: a loaded machine is slow, never this slow


def interrupt_when(command: list[str], marker: str, number: signal.Signals) -> tuple[int, list[str], str]:
    """Run `autoshard COMMAND`, send signal `number` once `marker` appears in its stderr or
    stdout; its exit code, the lines it printed on stderr after the marker other than progress
    (indented), and its stdout."""
    process = subprocess.Popen([sys.executable, "-m", "autoshard.cli.main", *command], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    seen = {process.stdout: "", process.stderr: ""}
    deadline = time.monotonic() + WAIT_S
    while marker not in seen[process.stdout] + seen[process.stderr]:
        assert time.monotonic() < deadline and process.poll() is None, seen
        for stream in select.select(list(seen), [], [], 1.0)[0]:
            seen[stream] += stream.readline()
    process.send_signal(number)
    out, err = process.communicate(timeout=WAIT_S)
    assert "Traceback" not in err
    return process.returncode, [line for line in err.splitlines() if not line.startswith("  ")], \
        seen[process.stdout] + out


@pytest.fixture(scope="module")
def gpt(tmp_path_factory) -> Path:
    """A training step big enough that formulating and solving each take seconds."""
    path = tmp_path_factory.mktemp("graphs") / "gpt.json"
    assert main(["generate", "gpt", "--training", "--layers", "2", "-o", str(path)]) == 0
    return path


def plan_command(graph: Path, output: Path, mesh: str = "dp=2,tp=4") -> list[str]:
    return ["plan", str(graph), "--mesh", mesh, "--topology", "dgx-h100", "--time-limit", "60", "--gap-limit", "0",
            "--verify", "never", "-o", str(output)]


@pytest.mark.parametrize("number", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_solving_writes_the_best_plan_so_far_and_exits_130(gpt, tmp_path, number):
    code, err, _ = interrupt_when(plan_command(gpt, tmp_path), "first plan within memory", number)
    assert code == INTERRUPTED and len(err) == 1, err
    assert err[0].startswith(f"autoshard plan: interrupted; wrote the best plan found so far to {tmp_path / 'plan.json'}")
    document = json.loads((tmp_path / "plan.json").read_text())
    assert document["solver"]["status"] == "interrupted"
    assert document["verification"]["status"] == "skipped"
    assert set(document["ops"]) and document["totals"]["step_s"] > 0


def test_a_signal_while_formulating_exits_130_with_one_line_and_writes_nothing(gpt, tmp_path):
    # a three-axis mesh formulates for many seconds: the phase is announced after 3
    command = plan_command(gpt, tmp_path, mesh="dp=2,tp=2,pp=2")
    code, err, _ = interrupt_when(command, "formulate: 3 s so far", signal.SIGINT)
    assert code == INTERRUPTED
    assert err == ["autoshard plan: interrupted before the solver had found a plan; nothing was written"]
    assert not (tmp_path / "plan.json").exists()


def test_a_signal_while_importing_the_users_code_exits_130_without_a_traceback(tmp_path):
    source = tmp_path / "slow.py"
    source.write_text(textwrap.dedent("""
        import time

        def make():
            print("building the model", flush=True)
            time.sleep(60)
    """))
    code, err, _ = interrupt_when(["import", "jax", f"{source}:make", "-o", str(tmp_path / "g.json")],
                                  "building the model", signal.SIGINT)
    assert (code, err) == (INTERRUPTED, ["autoshard import: interrupted"])


def test_a_running_cp_sat_solve_stops_when_asked_from_another_thread():
    # what the signal watcher does: CP-SAT holds the main thread in C++, where no Python handler runs
    fp = flatten(frustrated_ring(base=10**6))
    stopped = solve_exact(fp, time_limit_s=600, hint=np.zeros(fp.n, dtype=np.int64),
                          progress=lambda cost, bound, elapsed_s: stop_running_solves())
    assert stopped.x is not None and not stopped.optimal  # alone, CP-SAT proves this ring optimal at once
    assert solve_exact(fp, time_limit_s=600, hint=np.zeros(fp.n, dtype=np.int64)).optimal


def test_a_search_stopped_by_a_signal_stops_its_workers_and_exits_130(tmp_path):
    graph = Path(__file__).parent.parent / "examples" / "mlp.json"
    code, err, _ = interrupt_when(["search", str(graph), "--devices", "64", "--jobs", "1"], "bounding", signal.SIGINT)
    assert (code, err) == (INTERRUPTED, ["autoshard search: interrupted; the workers were stopped"])
