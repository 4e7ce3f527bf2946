"""The package order the `__init__` docstrings state: data flows one way, and no module of
autoshard imports a package that comes later in the pipeline (nor the service above it)."""

from __future__ import annotations

import ast
from pathlib import Path

import autoshard

ROOT = Path(autoshard.__file__).parent
# The pipeline, lowest first: a module may import its own unit and the units before it.
# `frontends` translate both ways: framework programs into graphs and plans back into the framework's shardings, so
# they sit above the plan's delivery.
ORDER = ("errors", "numerals", "encodable", "dtypes", "reductions", "affine", "mesh", "sharding", "phases", "ops",
         "resharding", "graph", "models", "solver", "pipeline", "planning", "spmd", "mlir", "sim", "delivery", "search",
         "frontends", "client", "cli")
FRONT_DOOR = "autoshard/__init__.py"  # re-exports the user's few names, lazily, from anywhere


def unit_of(module: str) -> str | None:
    """`autoshard.graph.schema` -> `graph`; None for what is not autoshard (or the package itself)."""
    parts = module.split(".")
    return parts[1] if parts[0] == "autoshard" and len(parts) > 1 else None


def imports_of(path: Path) -> list[tuple[int, str]]:
    """Every module an autoshard file imports (at any depth: imports inside functions count too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names] if node.module == "autoshard" else [node.module]
            found += [(node.lineno, name) for name in names]
    return found


def violations() -> list[str]:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT.parent).as_posix()
        if relative == FRONT_DOOR:
            continue
        unit = relative.removeprefix("autoshard/").split("/")[0].removesuffix(".py")
        assert unit in ORDER, f"{relative}: {unit!r} has no place in the package order; add it to ORDER"
        for line, module in imports_of(path):
            if module.split(".")[0] == "service":
                found.append(f"{relative}:{line} imports {module} (the service sits above autoshard)")
            target = unit_of(module)
            if target == "__version__":
                continue
            if target is not None and ORDER.index(target) > ORDER.index(unit):
                found.append(f"{relative}:{line} ({unit}) imports {module} ({target} comes later)")
    return found


def test_no_module_imports_a_later_package():
    assert violations() == []


def test_every_package_docstring_states_what_it_may_import():
    packages = [p for p in sorted(ROOT.iterdir()) if (p / "__init__.py").exists()]
    assert packages
    for package in packages:
        docstring = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
        assert "May import" in docstring, f"{package.name}/__init__.py does not say what it may import"


def test_the_check_catches_an_upward_import(tmp_path, monkeypatch):
    fake = tmp_path / "autoshard"
    (fake / "graph").mkdir(parents=True)
    (fake / "graph" / "model.py").write_text("from autoshard.planning.plan import Plan\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", fake)
    assert violations() == ["autoshard/graph/model.py:1 (graph) imports autoshard.planning.plan (planning comes later)"]


def test_the_front_door_gives_every_name_it_lists():
    names = [name for name in autoshard.__all__ if name != "__version__"]
    assert {"Mesh", "load_graph", "make_plan", "deliver", "estimate", "verify_plan"} <= set(names)
    for name in names:
        value = getattr(autoshard, name)
        assert value.__name__ == name and value.__module__.startswith("autoshard.")
