"""Text that can be written back out: every string of a document encodable as UTF-8.

JSON's `\\ud800` escape decodes to a lone surrogate, which Python holds in a `str` but cannot
encode; a name holding one fails only when it is printed, emitted as IR or sent in a response.
Documents are checked when they are read, so such a name is refused at the door, never stored.
"""

from __future__ import annotations

import math
from typing import Any

from autoshard.errors import InputError, Problem


def printable(text: str) -> str:
    """`text` with what UTF-8 cannot encode written as backslash escapes (safe to print)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _problem(text: str) -> str | None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        return (f"{printable(text[error.start:error.end])} at character {error.start} is a lone surrogate, "
                f"which UTF-8 cannot encode; names and text must be valid Unicode")
    return None


def _walk(value: Any, where: str, problems: list[Problem]) -> None:
    if isinstance(value, str):
        message = _problem(value)
        if message is not None:
            problems.append(Problem(where or "/", message))
    elif isinstance(value, dict):
        for key, item in value.items():
            child = f"{where}/{printable(str(key)).replace('~', '~0').replace('/', '~1')}"
            if isinstance(key, str) and (message := _problem(key)) is not None:
                problems.append(Problem(child, "the key: " + message))
            _walk(item, child, problems)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            _walk(item, f"{where}/{index}", problems)


def check_encodable(document: Any, where: str = "") -> None:
    """Raise an `InputError` naming (by JSON pointer under `where`) every string or key of `document`
    that UTF-8 cannot encode."""
    problems: list[Problem] = []
    try:
        _walk(document, where, problems)
    except RecursionError:
        raise InputError("not a document autoshard reads: nested too deeply", where or "/") from None
    if problems:
        raise InputError(problems)


def encodable_copy(value: Any) -> Any:
    """A copy of a JSON value that can always be written as strict JSON in UTF-8: strings and keys
    with escapes for what UTF-8 cannot encode, and null for numbers JSON has no spelling for (NaN,
    infinities). For data kept long after it was checked, such as a service's stored jobs."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {printable(key) if isinstance(key, str) else key: encodable_copy(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [encodable_copy(item) for item in value]
    return value
