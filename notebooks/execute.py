"""Execute every notebook here in place, so that each is stored with its tables and plots:

    .venv/bin/python notebooks/execute.py [NAME.ipynb ...]

`tests/test_notebooks.py` runs them again and checks that what is stored is such a run.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent


def execute(path: Path) -> nbformat.NotebookNode:
    """Run `path` top to bottom in a fresh kernel of this interpreter; return the executed notebook."""
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    return notebook


def main(names: list[str]) -> int:
    paths = [HERE / name for name in names] if names else sorted(HERE.glob("*.ipynb"))
    for path in paths:
        nbformat.write(execute(path), path)
        print(f"executed {path.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
