"""Numbers as users type them: ASCII digits only, and finite.

Python reads numbers more liberally than a reader of a command line does: `int("٣")` is 3 (any
Unicode decimal digit counts), `str.isdigit` accepts the superscript `"²"` that `int` then refuses,
and `float("1e400")` is infinity. Every size, count and numeric flag is read here instead, so a
number is either what it looks like in ASCII or refused naming the character that is not.
"""

from __future__ import annotations

import math
import re
import unicodedata

from autoshard.errors import InputError

_INTEGER = re.compile(r"[+-]?[0-9]+")
_REAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
# The most digits an integer typed by a user may have: well past any size, short of Python's
# int-string limit (4300 digits), whose ValueError would otherwise escape.
_MAX_DIGITS = 30


def _describe_character(char: str) -> str:
    """`'²' (U+00B2 SUPERSCRIPT TWO)`: the character, its code point and its Unicode name."""
    name = unicodedata.name(char, "")
    return f"{char!r} (U+{ord(char):04X}{' ' + name if name else ''})"


def non_ascii_problem(text: str) -> str | None:
    """What is wrong with a number spelled with a character outside ASCII, or None."""
    odd = next((c for c in text if not c.isascii()), None)
    if odd is None:
        return None
    return f"{_describe_character(odd)} is not an ASCII character; write numbers with the digits 0-9"


def parse_integer(text: str, where: str) -> int:
    """An integer in ASCII digits, with an optional sign (range checks are the caller's)."""
    stripped = text.strip()
    problem = non_ascii_problem(stripped)
    if problem is None and not _INTEGER.fullmatch(stripped):
        problem = f"expected a whole number, got {text!r}"
    if problem is None and len(stripped.lstrip("+-")) > _MAX_DIGITS:
        problem = f"expected a whole number of at most {_MAX_DIGITS} digits, got {len(stripped.lstrip('+-'))}"
    if problem is not None:
        raise InputError(problem, where)
    return int(stripped)


def parse_real(text: str, where: str) -> float:
    """A real number in ASCII (`1.5`, `2e-3`, also `nan` and `inf`: a caller that checks ranges
    says what it expects of those, with its other problems)."""
    stripped = text.strip()
    problem = non_ascii_problem(stripped)
    if (problem is None and not _REAL.fullmatch(stripped)
            and stripped.lower().lstrip("+-") not in ("nan", "inf", "infinity")):
        problem = f"expected a number like 1.5 or 2e-3, got {text!r}"
    if problem is not None:
        raise InputError(problem, where)
    return float(stripped)


def parse_finite(text: str, where: str) -> float:
    """A finite real number in ASCII; `nan`, `inf` and overflowing exponents (`1e400`) are refused."""
    value = parse_real(text, where)
    if math.isnan(value) or text.strip().lower().lstrip("+-") in ("inf", "infinity"):
        raise InputError(f"{text!r} is not a finite number", where)
    if not math.isfinite(value):
        raise InputError(f"{text!r} is beyond the range of a floating-point number", where)
    return value


def parse_dims(text: str, where: str, expected: str) -> tuple[int, ...]:
    """`4x4x4` -> (4, 4, 4): positive sizes in ASCII digits joined by x; `expected` describes the form."""
    parts = text.lower().split("x")
    problem = non_ascii_problem(text)
    if problem is None and not all(p.strip().isdigit() for p in parts):  # ASCII digits by now
        problem = f"{expected}, got {text!r}"
    if problem is not None:
        raise InputError(problem, where)
    dims = tuple(parse_integer(p, where) for p in parts)
    if not all(dims):
        raise InputError(f"{expected}, got {text!r}", where)
    return dims
