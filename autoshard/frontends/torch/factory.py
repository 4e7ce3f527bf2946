"""`FILE.py:FACTORY` -> an ExportedProgram: what `autoshard import torch` reads.

`FACTORY()` takes no arguments and returns `(module, args)` or `(module, args, kwargs)`, `args`
a tuple of example inputs at the shapes to plan for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autoshard.errors import InputError
from autoshard.frontends.torch.importer import canonical_program
from autoshard.frontends.torch.runtime import require_torch
from autoshard.frontends.user_code import SOURCE, as_user_error, call_factory, framework_quiet, load_user_factory

torch = require_torch()


def load_factory(spec: str) -> tuple[Path, Any, tuple[Any, ...], dict[str, Any]]:
    """Call the factory named by `FILE.py:FACTORY`: its file, and the module, args and kwargs it made."""
    path, factory = load_user_factory(spec)
    made = call_factory(path, factory)
    name = factory.__name__
    if not isinstance(made, tuple) or len(made) not in (2, 3):
        raise InputError(f"{name}() must return (module, args) or (module, args, kwargs), got {type(made).__name__}",
                         SOURCE)
    module, args, kwargs = (*made, {}) if len(made) == 2 else made
    if not isinstance(module, torch.nn.Module):
        raise InputError(f"{name}() must return a torch.nn.Module first, got {type(module).__name__}", SOURCE)
    if not isinstance(args, tuple):
        raise InputError(f"{name}() must return args as a tuple, got {type(args).__name__}", SOURCE)
    if not isinstance(kwargs, dict):
        raise InputError(f"{name}() must return kwargs as a dict, got {type(kwargs).__name__}", SOURCE)
    return path, module, args, kwargs


def export_factory(spec: str) -> Any:
    """Export the factory's module at its example inputs, in the canonical form every path imports
    (`canonical_program`), so a plan made from it applies to `torch.export.export(module, args)`
    in the user's own script. What the module's code raises while exported (a shape mismatch,
    control flow on a traced value) is a `UserCodeError` at its line."""
    path, module, args, kwargs = load_factory(spec)
    with as_user_error(path, f"torch.export of {spec.rpartition(':')[2]}()'s module"), framework_quiet():
        exported = torch.export.export(module.eval(), args, kwargs)
    return canonical_program(exported)
