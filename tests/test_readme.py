"""The README's commands work as written: the quick start's plan, the service's curl example and
the PyTorch example, against a real `autoshard serve` and DTensor."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from autoshard.cli.main import main
from autoshard.client import LocalService

ROOT = Path(__file__).parent.parent
README = (ROOT / "README.md").read_text()


def shell_block(section: str) -> str:
    """The first ```sh block under the `## section` heading."""
    body = README.split(f"## {section}\n", 1)[1]
    return re.search(r"```sh\n(.*?)```", body, re.S).group(1)


def test_quick_start_plan_runs_and_writes_what_the_readme_says(tmp_path, monkeypatch, capsys):
    first_line = shell_block("Quick start").splitlines()[0]
    plan_command = first_line.split("&& .venv/bin/autoshard ", 1)[1]
    args = shlex.split(plan_command)
    output = args[args.index("-o") + 1]
    monkeypatch.chdir(ROOT)
    args[args.index("-o") + 1] = str(tmp_path / output)
    assert main(args) == 0
    written = sorted(p.name for p in (tmp_path / output).iterdir())
    assert written == ["annotated.mlir", "partitioned.mlir", "plan.json"]
    for name in written:
        assert f"{output}/{name}" in README
    assert "simulator: PASS" in capsys.readouterr().out


def test_service_curl_example_answers_with_a_verified_plan(tmp_path):
    lines = shell_block("Service").replace("\\\n", "").splitlines()
    serve, request = lines[0], lines[1]
    assert serve.startswith(".venv/bin/autoshard serve --port 8000")
    service = LocalService(tmp_path / "plans.sqlite3")
    service.start()
    try:
        answer = subprocess.run(["bash", "-c", request.replace("http://127.0.0.1:8000", service.url)], cwd=ROOT,
                                capture_output=True, text=True, check=True, timeout=120)
    finally:
        service.stop()
    job = json.loads(answer.stdout)
    assert job["status"] == "done", job
    assert job["plan"]["format"] == "autoshard.plan/v1" and job["plan"]["verification"]["status"] == "passed"


def test_python_api_example_runs_and_delivers_verified_ir(monkeypatch, capsys):
    code = re.search(r"## Python API\n.*?```python\n(.*?)```", README, re.S).group(1)
    # the front door is enough: one import, every other name reached through it
    assert [line for line in code.splitlines() if "import" in line] == ["import autoshard"]
    monkeypatch.chdir(ROOT)
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    delivered = namespace["delivered"]
    assert delivered.document["verification"]["status"] == "passed"
    assert sorted(delivered.ir) == ["annotated", "partitioned"] and "shard.grid @mesh" in delivered.ir["partitioned"]
    assert "PASS" in capsys.readouterr().out


def test_from_pytorch_example_runs_the_plan_under_dtensor(capsys):
    torch = pytest.importorskip("torch")
    code = re.search(r"## From PyTorch\n.*?```python\n(.*?)```", README, re.S).group(1)
    namespace: dict = {}
    try:
        exec(compile(code, "README.md", "exec"), namespace)
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    printed = capsys.readouterr().out
    # what the README says it prints
    said = re.search(r"It prints `(.*?)` .*?and `(.*?)`\.", README.split("## From PyTorch\n", 1)[1], re.S)
    assert said.group(1) in printed
    assert printed.rstrip().endswith(f"DTensor output equals the unsharded module's: {said.group(2)}")
    # the budget is below the replicated weights alone: the plan had to shard them
    graph = namespace["graph"]
    assert namespace["result"].solver["memory_budget_bytes"] < sum(t.bytes for t in graph.tensors_with_role("parameter"))
