"""How a torch value becomes a graph tensor: its dtype's name, a complex value as a real one with a
trailing dim of 2 (real, imaginary: the layout of `view_as_real`), and a value with a zero-size dim
as no tensor at all (it holds nothing to place or compute)."""

from __future__ import annotations

from typing import Any

from autoshard.frontends.torch.lowering import DTYPES, Unsupported
from autoshard.frontends.torch.runtime import require_torch

torch = require_torch()

# complex dtype -> the dtype of its parts
COMPLEX = {"complex64": "f32", "complex128": "f64"}


def dtype_name(dtype: Any) -> str:
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise Unsupported(f"dtype {name} has no autoshard equivalent")
    return DTYPES[name]


def value_shape(value: Any) -> list[int]:
    """The shape of a value's graph tensor: a complex value's with the trailing 2."""
    return [int(s) for s in value.shape] + ([2] if value.is_complex() else [])


def value_dtype(value: Any) -> str:
    """The dtype of a value's graph tensor: a complex value's parts'."""
    name = str(value.dtype).removeprefix("torch.")
    return COMPLEX[name] if name in COMPLEX else dtype_name(value.dtype)


def is_complex(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_complex()


def is_empty(value: Any) -> bool:
    """A tensor value with a zero-size dim."""
    return isinstance(value, torch.Tensor) and value.numel() == 0


def as_real(value: Any) -> Any:
    """A complex result as the graph holds it: its parts in a trailing dim."""
    return torch.view_as_real(value) if is_complex(value) else value


def reads_or_makes_complex(node: Any) -> bool:
    """Whether an FX node's value or one of its inputs is complex."""
    values = [node.meta.get("val")] + [n.meta.get("val") for n in node.all_input_nodes]
    return any(is_complex(x) for v in values for x in (v if isinstance(v, (tuple, list)) else [v]))
