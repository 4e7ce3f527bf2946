"""What a training step declares about its values: which ones overwrite a parameter or input in
place (`updates`), which are a parameter's gradient (`grad_of`), and which dim of an input
carries the batch (`batch_dim`). Checked here, once, for every reader of a graph."""

from __future__ import annotations

from typing import Mapping, Sequence

from autoshard.errors import Problem
from autoshard.graph.model import Tensor

STATE_FIELDS = ("updates", "grad_of", "batch_dim")
STATE_ROLES = ("input", "parameter")


def state_problems(tensors: Mapping[str, Tensor], producer: Mapping[str, str],
                   outputs: Sequence[str]) -> list[Problem]:
    """Every declaration that cannot hold, each at its field's JSON pointer."""
    problems: list[Problem] = []
    returned = set(outputs)
    written: dict[str, str] = {}  # overwritten value -> the value writing it
    graded: dict[str, str] = {}  # parameter -> its gradient
    for name, t in tensors.items():
        where = f"/tensors/{name}"
        if t.updates is not None:
            problems.extend(_update_problems(name, t, tensors, producer, returned, written, f"{where}/updates"))
        if t.grad_of is not None:
            problems.extend(_gradient_problems(name, t, tensors, producer, graded, f"{where}/grad_of"))
        if t.batch_dim is not None:
            if t.role != "input":
                problems.append(Problem(f"{where}/batch_dim", f"tensor {name!r}: only an input carries a batch dim, "
                                                              f"and this one has role {t.role!r}"))
            elif not 0 <= t.batch_dim < len(t.shape):
                problems.append(Problem(f"{where}/batch_dim", f"tensor {name!r}: batch dim {t.batch_dim} is not one of "
                                                              f"its {len(t.shape)} dims (0 to {len(t.shape) - 1})"))
    for old, new in written.items():
        if old in returned:
            problems.append(Problem(f"/tensors/{new}/updates", f"tensor {new!r} overwrites {old!r}, which is also a graph "
                                                               f"output: its old value would be returned after being overwritten"))
    return problems


def _update_problems(name: str, t: Tensor, tensors: Mapping[str, Tensor], producer: Mapping[str, str],
                     returned: set[str], written: dict[str, str], where: str) -> list[Problem]:
    old = tensors.get(t.updates)
    label = f"tensor {name!r} updates {t.updates!r} in place"
    if old is None:
        return [Problem(where, f"{label}, but no tensor has that name")]
    problems = []
    if old.role not in STATE_ROLES:
        problems.append(Problem(where, f"{label}, but only an input or a parameter can be overwritten; "
                                       f"{t.updates!r} has role {old.role!r}"))
    if name not in producer:
        problems.append(Problem(where, f"{label}, but no op produces {name!r}"))
    if name not in returned:
        problems.append(Problem(where, f"{label}, so it must be a graph output (listed in /outputs)"))
    if (old.shape, old.dtype) != (t.shape, t.dtype):
        problems.append(Problem(where, f"{label}: both must have one shape and dtype, got {list(t.shape)} {t.dtype} "
                                       f"for {list(old.shape)} {old.dtype}"))
    if t.updates in written:
        problems.append(Problem(where, f"{label}, which {written[t.updates]!r} already overwrites"))
    else:
        written[t.updates] = name
    return problems


def _gradient_problems(name: str, t: Tensor, tensors: Mapping[str, Tensor], producer: Mapping[str, str],
                       graded: dict[str, str], where: str) -> list[Problem]:
    param = tensors.get(t.grad_of)
    label = f"tensor {name!r} is declared the gradient of {t.grad_of!r}"
    if param is None:
        return [Problem(where, f"{label}, but no tensor has that name")]
    problems = []
    if param.role != "parameter":
        problems.append(Problem(where, f"{label}, which has role {param.role!r}; only parameters have gradients"))
    if name not in producer:
        problems.append(Problem(where, f"{label}, but no op produces it"))
    if param.shape != t.shape:
        problems.append(Problem(where, f"{label}: a gradient has its parameter's shape {list(param.shape)}, "
                                       f"got {list(t.shape)}"))
    if t.grad_of in graded:
        problems.append(Problem(where, f"{label}, whose gradient is already {graded[t.grad_of]!r}"))
    else:
        graded[t.grad_of] = name
    return problems
