"""torch, imported on demand: the base install of autoshard does not need it."""

from __future__ import annotations

import importlib
from types import ModuleType

from autoshard.errors import InputError

EXTRA = "autoshard[torch]"
PINNED = "torch==2.13.0"


def require_torch() -> ModuleType:
    """The torch module, or an InputError saying which extra to install."""
    try:
        return importlib.import_module("torch")
    except ImportError:
        raise InputError(f"the PyTorch frontend needs torch: pip install '{EXTRA}' (it pins {PINNED})",
                         "torch") from None
