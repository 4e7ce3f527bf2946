"""jax is an optional extra: autoshard imports and runs without it, and the JAX frontend, asked
for without jax installed, says which extra to install instead of failing with a traceback."""

from __future__ import annotations

import sys

import pytest

from autoshard.cli.main import main
from autoshard.errors import AutoshardError


@pytest.fixture
def without_jax(monkeypatch):
    for name in [m for m in sys.modules if m == "jax" or m.startswith("jax.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "jax", None)  # `import jax` now raises ImportError


def test_the_frontend_names_the_extra_when_jax_is_missing(without_jax):
    import autoshard.frontends.jax as frontend  # importing the package does not need jax

    with pytest.raises(AutoshardError, match=r"pip install 'autoshard\[jax\]'"):
        frontend.from_function(lambda x: x, 1.0)


def test_the_import_command_names_the_extra_when_jax_is_missing(without_jax, tmp_path, capsys):
    (tmp_path / "model.py").write_text("def make():\n    return (lambda x: x), (1.0,)\n")
    assert main(["import", "jax", f"{tmp_path / 'model.py'}:make", "-o", str(tmp_path / "g.json")]) == 2
    assert "autoshard[jax]" in capsys.readouterr().err
