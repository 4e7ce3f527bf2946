"""`FILE.py:FACTORY` -> an ExportedProgram: what `autoshard import torch` reads.

`FACTORY()` takes no arguments and returns `(module, args)` or `(module, args, kwargs)`, `args`
a tuple of example inputs at the shapes to plan for.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

from autoshard.errors import InputError
from autoshard.frontends.torch.runtime import require_torch

torch = require_torch()


def load_factory(spec: str) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """Call the factory named by `FILE.py:FACTORY`; its module, args and kwargs."""
    path, sep, name = spec.rpartition(":")
    if not sep or not path or not name:
        raise InputError(f"expected FILE.py:FACTORY, got {spec!r}", "source")
    if not Path(path).is_file():
        raise InputError(f"no such file: {path}", "source")
    module_spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    if module_spec is None or module_spec.loader is None:
        raise InputError(f"cannot load {path} as a Python module", "source")
    code = importlib.util.module_from_spec(module_spec)
    sys.modules.setdefault(module_spec.name, code)  # so classes defined there can be found by name
    module_spec.loader.exec_module(code)
    factory = getattr(code, name, None)
    if not callable(factory):
        raise InputError(f"{path} defines no function {name!r}", "source")
    made = factory()
    if not isinstance(made, tuple) or len(made) not in (2, 3):
        raise InputError(f"{name}() must return (module, args) or (module, args, kwargs), got {type(made).__name__}", "source")
    module, args, kwargs = (*made, {}) if len(made) == 2 else made
    if not isinstance(module, torch.nn.Module):
        raise InputError(f"{name}() must return a torch.nn.Module first, got {type(module).__name__}", "source")
    if not isinstance(args, tuple):
        raise InputError(f"{name}() must return args as a tuple, got {type(args).__name__}", "source")
    if not isinstance(kwargs, dict):
        raise InputError(f"{name}() must return kwargs as a dict, got {type(kwargs).__name__}", "source")
    return module, args, kwargs


def export_factory(spec: str) -> Any:
    """Export the factory's module at its example inputs, decomposed so that no in-place op
    survives while `linear`, `silu` and attention stay whole."""
    module, args, kwargs = load_factory(spec)
    try:
        exported = torch.export.export(module.eval(), args, kwargs)
    except Exception as error:  # torch.export reports untraceable programs with many exception types
        raise InputError(f"torch.export failed: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}",
                         "source") from error
    return exported.run_decompositions({})
