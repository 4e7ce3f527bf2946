"""Frameworks are optional extras: the command line, the frontends package and the placement
strings of plan.json work without importing torch."""

from __future__ import annotations

import subprocess
import sys


def test_the_cli_and_the_placement_strings_do_not_import_torch():
    code = ("import sys\n"
            "from autoshard.cli.main import build_parser\n"
            "build_parser()\n"
            "import autoshard.frontends.torch.placements\n"
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n")
    answer = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert answer.stdout.strip() == "[]"
