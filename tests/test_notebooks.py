"""Every notebook in notebooks/ executes top to bottom without a cell error, and is stored as
such a run: every code cell executed in order, with the kinds of output a fresh run gives."""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
import pytest

NOTEBOOK_DIR = Path(__file__).parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
sys.path.insert(0, str(NOTEBOOK_DIR))
from execute import execute  # noqa: E402  (notebooks/execute.py, the script that stores them executed)


def output_kinds(cell) -> list[str]:
    """What a code cell showed, by kind (stream name, or the MIME types of a display), not by value."""
    kinds = []
    for output in cell.get("outputs", []):
        if output["output_type"] == "stream":
            kinds.append(f"stream:{output['name']}")
        elif output["output_type"] in ("display_data", "execute_result"):
            kinds.append(",".join(sorted(output["data"])))
        else:
            kinds.append(output["output_type"])
    return kinds


def test_there_are_notebooks():
    assert [p.name for p in NOTEBOOKS] == ["gpt_memory_communication.ipynb", "mesh_search.ipynb",
                                           "weight_stationary_mlp.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_and_is_stored_executed(path):
    stored = nbformat.read(path, as_version=4)
    code = [cell for cell in stored.cells if cell.cell_type == "code"]
    assert [cell.execution_count for cell in code] == list(range(1, len(code) + 1)), \
        f"{path.name} is not stored executed top to bottom: run notebooks/execute.py"
    executed = execute(path)
    errors = [output for cell in executed.cells for output in cell.get("outputs", [])
              if output.get("output_type") == "error"]
    assert not errors
    fresh = [cell for cell in executed.cells if cell.cell_type == "code"]
    assert [output_kinds(cell) for cell in code] == [output_kinds(cell) for cell in fresh], \
        f"{path.name}'s stored outputs are not those of a fresh run: run notebooks/execute.py"
    assert any("image/png" in kind for cell in code for kind in output_kinds(cell)), "no plot stored"
