"""jax, imported when a function of this package first needs it."""

from __future__ import annotations

import importlib
from types import ModuleType

from autoshard.errors import AutoshardError

EXTRA = "autoshard[jax]"


def require_jax(module: str = "jax") -> ModuleType:
    """`module` of jax (`jax`, `jax.extend.core`, ...), or an error saying how to install jax."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise AutoshardError(f"the JAX frontend needs jax, which is not installed ({error}); "
                             f"install the extra: pip install '{EXTRA}'") from None
