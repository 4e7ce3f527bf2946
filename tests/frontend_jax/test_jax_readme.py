"""The README's "From JAX" example runs as written: it plans an MLP that really shards, runs it on
8 CPU devices equal to the unsharded function, and XLA's collectives move the bytes the plan says."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

ROOT = Path(__file__).parent.parent.parent


def test_the_from_jax_example_runs_sharded_and_matches_the_plans_bytes(monkeypatch, capsys):
    readme = (ROOT / "README.md").read_text()
    code = re.search(r"## From JAX\n.*?```python\n(.*?)```", readme, re.S).group(1)
    monkeypatch.chdir(ROOT)
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    printed = capsys.readouterr().out
    assert "matches the unsharded result: True" in printed
    plan, x = namespace["result"].plan, namespace["x"]
    assert any(s.split_axes for t, s in plan.storage.items() if t.startswith("params"))
    np.testing.assert_allclose(np.asarray(namespace["y"]), np.asarray(namespace["mlp"](namespace["params"], x)),
                               atol=1e-5)
    xla = sum(c.bytes_per_device for c in namespace["xla"])
    ours = sum(c.bytes_per_device for c in namespace["ours"])
    assert xla > 0 and abs(xla - ours) <= 0.1 * ours
    assert f"collective bytes per device: XLA {xla}, plan {ours}" in printed
