"""The user's own code is the user's: `autoshard import torch FILE:FACTORY` whose file, factory or
module fails exits 2 with one problem naming the file, the line and the exception, without
torch's own log lines; the Python API raises the same `UserCodeError`."""

from __future__ import annotations

import textwrap

import pytest

pytest.importorskip("torch")

from autoshard.cli.main import main  # noqa: E402
from autoshard.frontends.torch import export_factory  # noqa: E402
from autoshard.frontends.user_code import UserCodeError  # noqa: E402

MODEL = """
import torch

class Net(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.a = torch.nn.Linear(4, 8)
        self.b = torch.nn.Linear(inner, 4)

    def forward(self, x):
        return self.b(self.a(x))

class Branches(torch.nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x
"""

# name -> (the file's text, its line the error names, what the error says)
BROKEN = {
    "syntax error": ("def make(:\n    pass\n", 1, "importing model.py raised SyntaxError: invalid syntax"),
    "import error": ("import no_such_module_here\n", 1,
                     "importing model.py raised ModuleNotFoundError: No module named 'no_such_module_here'"),
    "factory raises": ("def load():\n    raise ValueError('no checkpoint')\n\ndef make():\n    return load()\n", 2,
                       "make() raised ValueError: no checkpoint"),
    "factory takes arguments": ("def make(size, depth=2):\n    return None\n", 1,
                                "make() must take no arguments; it needs size"),
    "shape mismatch": (MODEL + "\ndef make():\n    return Net(16), (torch.randn(2, 4),)\n", 11,
                       "torch.export of make()'s module raised RuntimeError: a and b must have same reduction dim"),
    "control flow on a traced value": (MODEL + "\ndef make():\n    return Branches(), (torch.randn(2, 4),)\n", 15,
                                       "torch.export of make()'s module raised GuardOnDataDependentSymNode"),
}


@pytest.mark.parametrize("case", BROKEN)
def test_a_failure_in_the_users_code_exits_2_naming_file_line_and_exception(tmp_path, capfd, case):
    text, line, message = BROKEN[case]
    source = tmp_path / "model.py"
    source.write_text(textwrap.dedent(text))
    assert main(["import", "torch", f"{source}:make", "-o", str(tmp_path / "graph.json")]) == 2
    lines = capfd.readouterr().err.splitlines()
    assert lines[0] == "autoshard import: 1 problem(s):"
    assert lines[1].startswith(f"  {source}:{line}: {message}"), lines
    assert len(lines) == 2, lines  # none of torch's log lines or prints
    assert not (tmp_path / "graph.json").exists()


def test_the_python_api_raises_the_users_error_with_its_line(tmp_path):
    text, line, message = BROKEN["shape mismatch"]
    (tmp_path / "model.py").write_text(text)
    with pytest.raises(UserCodeError) as error:
        export_factory(f"{tmp_path / 'model.py'}:make")
    assert error.value.problems[0].where == f"{tmp_path / 'model.py'}:{line}"
    assert message in error.value.problems[0].message
