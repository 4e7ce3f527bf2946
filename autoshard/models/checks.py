"""Argument checks shared by the model configs: every problem found, named by field."""

from __future__ import annotations

from typing import Any

from autoshard.dtypes import DTYPES
from autoshard.errors import InputError, Problem


def positive_ints(config: Any, *fields: str) -> list[Problem]:
    problems = []
    for name in fields:
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            problems.append(Problem(name, f"must be a positive integer, got {value!r}"))
    return problems


def float_dtype(value: str, field: str = "dtype") -> list[Problem]:
    floats = sorted(n for n, d in DTYPES.items() if d.is_float)
    return [] if value in floats else [Problem(field, f"must be one of {floats}, got {value!r}")]


def one_of(value: Any, choices: tuple[Any, ...], field: str) -> list[Problem]:
    return [] if value in choices else [Problem(field, f"must be one of {list(choices)}, got {value!r}")]


def raise_problems(problems: list[Problem]) -> None:
    if problems:
        raise InputError(problems)
