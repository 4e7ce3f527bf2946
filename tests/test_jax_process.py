"""The JAX frontend's tests (tests/frontend_jax) run in a process of their own, on 8 fake CPU
devices: XLA reads the device count once, when jax is first imported, so it is set before."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.devices import JAX_DEVICES_FLAG

HERE = Path(__file__).parent


def test_the_jax_tests_pass_on_eight_cpu_devices():
    pytest.importorskip("jax")
    env = {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {JAX_DEVICES_FLAG}".strip()}
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", str(HERE / "frontend_jax")],
                         cwd=HERE.parent, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-20000:] + run.stderr[-5000:]
    assert " passed" in run.stdout and " skipped" not in run.stdout, run.stdout[-2000:]
