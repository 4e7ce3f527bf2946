"""The seconds an event simulation is given, checked and brought to one shape: per (stage,
chunk) work seconds, per stage-boundary transfer seconds each way, per stage tail seconds.

Every bad value is reported with where it is (`forward_s[1][0]`, `transfer_s[backward][2]`).
"""

from __future__ import annotations

from typing import Callable, Sequence, Union

import numpy as np

from autoshard.errors import Problem

DIRECTIONS = ("forward", "backward")  # activations to the next virtual stage, gradients to the one before
TAIL = "gradient reduction + optimizer"  # a tail given as one part

Seconds = Union[float, Sequence[float], Sequence[Sequence[float]], np.ndarray]
TransferSeconds = Union[None, Seconds, Callable[[int, str], float]]


def per_chunk(name: str, value: Seconds, stages: int, chunks: int, problems: list[Problem]) -> np.ndarray:
    """`value` as a (stages, chunks) array: one number for all, one per stage (its chunks equal),
    or one per (stage, chunk)."""
    array = _array(name, value, problems)
    if array is None:
        return np.zeros((stages, chunks))
    if array.ndim == 1 and array.shape == (stages,):
        array = np.repeat(array[:, None], chunks, axis=1)
    elif array.ndim == 0:
        array = np.full((stages, chunks), float(array))
    elif array.shape != (stages, chunks):
        problems.append(Problem(name, f"has shape {array.shape}; expected a number, {stages} per-stage numbers or "
                                      f"({stages}, {chunks}) per (stage, chunk)"))
        return np.zeros((stages, chunks))
    _check_times(name, array, problems)
    return array


def per_stage(name: str, value: Seconds, stages: int, problems: list[Problem]) -> np.ndarray:
    """`value` as a (stages,) array: one number for all or one per stage."""
    array = _array(name, value, problems)
    if array is None:
        return np.zeros(stages)
    if array.ndim == 0:
        array = np.full(stages, float(array))
    elif array.shape != (stages,):
        problems.append(Problem(name, f"has shape {array.shape}; expected a number or {stages} per-stage numbers"))
        return np.zeros(stages)
    _check_times(name, array, problems)
    return array


def per_boundary(name: str, value: TransferSeconds, boundaries: int, problems: list[Problem]) -> np.ndarray:
    """Transfer seconds as a (2, boundaries) array, rows `DIRECTIONS`; boundary `b` joins virtual
    stages `b` and `b + 1`. `value`: None (free), one number, one per boundary (both ways), a
    (2, boundaries) table, or a callable `(boundary, direction) -> seconds`."""
    if value is None:
        return np.zeros((2, boundaries))
    if callable(value):
        value = [[value(b, direction) for b in range(boundaries)] for direction in DIRECTIONS]
    array = _array(name, value, problems)
    if array is None:
        return np.zeros((2, boundaries))
    if array.ndim == 0:
        array = np.full((2, boundaries), float(array))
    elif array.shape == (boundaries,):
        array = np.stack([array, array])
    elif array.shape != (2, boundaries):
        problems.append(Problem(name, f"has shape {array.shape}; expected a number, {boundaries} per-boundary numbers, "
                                      f"(2, {boundaries}) for forward and backward, or a callable"))
        return np.zeros((2, boundaries))
    for row, direction in enumerate(DIRECTIONS):
        _check_times(f"{name}[{direction}]", array[row], problems)
    return array


def _array(name: str, value, problems: list[Problem]) -> np.ndarray | None:
    try:
        return np.asarray(value, dtype=float)
    except (TypeError, ValueError) as error:
        problems.append(Problem(name, f"must be seconds (numbers), got {value!r}: {error}"))
        return None


def _check_times(name: str, array: np.ndarray, problems: list[Problem]) -> None:
    for index in zip(*np.nonzero(~(np.isfinite(array) & (array >= 0)))):
        where = name + "".join(f"[{i}]" for i in index)
        problems.append(Problem(where, f"must be a finite number of seconds >= 0, got {float(array[index])!r}"))
