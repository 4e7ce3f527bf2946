"""Frameworks are optional extras: the command line, the frontends package and the placement
strings of plan.json work without importing torch."""

from __future__ import annotations

import subprocess
from pathlib import Path
import sys


def test_the_cli_and_the_placement_strings_do_not_import_torch():
    code = ("import sys\n"
            "from autoshard.cli.main import build_parser\n"
            "build_parser()\n"
            "import autoshard.delivery.dtensor_placements\n"
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n")
    answer = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert answer.stdout.strip() == "[]"


def test_every_plan_document_gives_the_frameworks_shardings():
    """`deliver` (the CLI, the service and the Python API alike) writes both vocabularies."""
    code = ("import sys, autoshard\n"
            "mesh = autoshard.Mesh.parse('dp=2,tp=4')\n"
            "graph = autoshard.load_graph('examples/mlp.json', mesh)\n"
            "hw = autoshard.bind_hardware('dgx-h100', mesh)\n"
            "result = autoshard.make_plan(graph, mesh, hw, autoshard.SolveSettings(time_limit_s=5, deterministic=True))\n"
            "doc = autoshard.deliver(result, hw, 'dgx-h100', verify='never').document\n"
            "print(doc['dtensor']['mesh_dim_names'], len(doc['dtensor']['tensors']) == len(graph.tensors),\n"
            "      sorted(doc['partition_specs']) == ['inputs', 'intermediates', 'not_expressible', 'outputs'],\n"
            "      sorted(m for m in ('torch', 'jax') if m in sys.modules))\n")
    root = Path(__file__).parent.parent
    answer = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300,
                            cwd=root)
    assert answer.stdout.strip() == "['dp', 'tp'] True True []"
