"""Affine maps in MLIR syntax: `(d0, d1, d2) -> (d0, d2)`, `(d0, d1) -> (d0 * 64 + d1)`.

Each result is a sum of loops with integer coefficients plus a constant: enough for
transposes, broadcasts (constant 0), reshapes (`d1 * 64 + d2`), slices and windows (`d0 + 4`).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Callable, Sequence

from autoshard.errors import InputError


@dataclass(frozen=True, slots=True)
class AffineExpr:
    """`sum(coeff * d_loop) + const`; terms sorted by loop, no zero coefficients."""

    terms: tuple[tuple[int, int], ...] = ()
    const: int = 0

    @staticmethod
    def loop(index: int, coeff: int = 1) -> "AffineExpr":
        return _loop_expr(index, coeff)

    @staticmethod
    def constant(value: int) -> "AffineExpr":
        return _constant_expr(value)

    def __add__(self, other: "AffineExpr | int") -> "AffineExpr":
        if isinstance(other, int):
            return AffineExpr(self.terms, self.const + other)
        coeffs = dict(self.terms)
        for loop, c in other.terms:
            coeffs[loop] = coeffs.get(loop, 0) + c
        return AffineExpr(tuple(sorted((l, c) for l, c in coeffs.items() if c)), self.const + other.const)

    def __mul__(self, k: int) -> "AffineExpr":
        return AffineExpr(tuple((l, c * k) for l, c in self.terms if c * k), self.const * k)

    @property
    def loops(self) -> tuple[int, ...]:
        return tuple(l for l, _ in self.terms)

    def single_loop(self) -> int | None:
        """The loop if the expression is exactly `d_i`, else None."""
        if len(self.terms) == 1 and self.terms[0][1] == 1 and self.const == 0:
            return self.terms[0][0]
        return None

    def evaluate(self, point: Sequence[int]) -> int:
        return sum(point[l] * c for l, c in self.terms) + self.const

    def bounds(self, extents: Sequence[int]) -> tuple[int, int]:
        """Smallest and largest value over the loop box `[0, extents)`."""
        low = high = self.const
        for loop, c in self.terms:
            top = c * (extents[loop] - 1)
            low += min(0, top)
            high += max(0, top)
        return low, high

    def range_over(self, starts: Sequence[int], sizes: Sequence[int]) -> tuple[int, int]:
        """Smallest and largest value over the block `[starts, starts + sizes)` of the loops."""
        low = high = self.evaluate(starts)
        for loop, c in self.terms:
            top = c * (sizes[loop] - 1)
            low += min(0, top)
            high += max(0, top)
        return low, high

    def __str__(self) -> str:
        parts: list[str] = []
        for loop, c in sorted(self.terms, key=lambda t: t[0]):
            text = f"d{loop}" if abs(c) == 1 else f"d{loop} * {abs(c)}"
            if not parts:
                parts.append(text if c > 0 else (f"-d{loop}" if c == -1 else f"d{loop} * {c}"))
            else:
                parts.append(("+ " if c > 0 else "- ") + text)
        if self.const or not parts:
            if not parts:
                parts.append(str(self.const))
            else:
                parts.append(("+ " if self.const > 0 else "- ") + str(abs(self.const)))
        return " ".join(parts)


# Every op's maps are built from these; a graph of thousands of ops asks for the same few again
# and again, and the expressions are immutable.
@functools.lru_cache(maxsize=4096)
def _loop_expr(index: int, coeff: int) -> AffineExpr:
    return AffineExpr(((index, coeff),))


@functools.lru_cache(maxsize=4096)
def _constant_expr(value: int) -> AffineExpr:
    return AffineExpr((), value)


@dataclass(frozen=True, slots=True)
class AffineMap:
    """A map from `num_loops` loop indices to one expression per tensor dim."""

    num_loops: int
    results: tuple[AffineExpr, ...]

    @classmethod
    def from_callable(cls, num_loops: int, fn: Callable[..., Sequence[AffineExpr | int]]) -> "AffineMap":
        """Build a map from a lambda over loop expressions, e.g. `lambda m, n, k: (m, k)`."""
        loops = [AffineExpr.loop(i) for i in range(num_loops)]
        results = tuple(r if isinstance(r, AffineExpr) else AffineExpr.constant(r) for r in fn(*loops))
        return cls(num_loops, results)

    @classmethod
    def identity(cls, rank: int) -> "AffineMap":
        return cls(rank, tuple(AffineExpr.loop(i) for i in range(rank)))

    @classmethod
    def parse(cls, text: str, where: str = "") -> "AffineMap":
        return _parse_map(text, where)

    @property
    def rank(self) -> int:
        return len(self.results)

    def evaluate(self, point: Sequence[int]) -> tuple[int, ...]:
        return tuple(r.evaluate(point) for r in self.results)

    def __str__(self) -> str:
        loops = ", ".join(f"d{i}" for i in range(self.num_loops))
        return f"({loops}) -> ({', '.join(str(r) for r in self.results)})"


_TOKEN = re.compile(r"\s*(?:(d\d+)|(\d+)|([-+*]))")


def _parse_expr(text: str, loops: dict[str, int], where: str) -> AffineExpr:
    """Parse `[-]term ([+-] term)*` where a term is `d_i`, `N`, `d_i * N` or `N * d_i`."""
    pos, expr, sign = 0, AffineExpr(), 1
    text = text.strip()
    expect_term = True
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if not match:
            raise InputError(f"unexpected {text[pos:]!r} in affine expression {text!r}", where)
        pos = match.end()
        name, number, op = match.groups()
        if expect_term:
            if op == "-":
                sign = -sign
                continue
            if op == "+":
                continue
            term, pos = _parse_term(text, pos, name, number, loops, where)
            expr = expr + term * sign
            sign, expect_term = 1, False
        else:
            if op not in ("+", "-"):
                raise InputError(f"expected + or - in affine expression {text!r}", where)
            sign = 1 if op == "+" else -1
            expect_term = True
    if expect_term:
        raise InputError(f"affine expression {text!r} is incomplete", where)
    return expr


def _parse_term(text: str, pos: int, name: str | None, number: str | None,
                loops: dict[str, int], where: str) -> tuple[AffineExpr, int]:
    def atom(n: str | None, k: str | None) -> AffineExpr:
        if n is not None:
            if n not in loops:
                raise InputError(f"{n} is not a loop of this map (loops: {', '.join(loops) or 'none'})", where)
            return AffineExpr.loop(loops[n])
        if k is None:
            raise InputError(f"expected a loop or an integer in {text!r}", where)
        return AffineExpr.constant(int(k))

    left = atom(name, number)
    match = _TOKEN.match(text, pos)
    if match and match.group(3) == "*":
        right_match = _TOKEN.match(text, match.end())
        negate = bool(right_match and right_match.group(3) == "-")  # MLIR prints `d0 * -2`
        if negate:
            right_match = _TOKEN.match(text, right_match.end())
        if not right_match or right_match.group(3):
            raise InputError(f"expected a factor after * in {text!r}", where)
        right = atom(right_match.group(1), right_match.group(2)) * (-1 if negate else 1)
        if left.terms and right.terms:
            raise InputError(f"product of two loops is not affine in {text!r}", where)
        product = left * right.const if left.terms else right * left.const
        return product, right_match.end()
    return left, pos


_MAP = re.compile(r"^\s*\(([^()]*)\)\s*->\s*\(([^()]*)\)\s*$")


def _parse_map(text: str, where: str) -> AffineMap:
    if not isinstance(text, str):
        raise InputError(f"expected an affine map string like '(d0, d1) -> (d0)', got {text!r}", where)
    match = _MAP.match(text)
    if not match:
        raise InputError(f"cannot parse affine map {text!r}; expected e.g. '(d0, d1) -> (d1, d0)'", where)
    names = [n.strip() for n in match.group(1).split(",") if n.strip()]
    for i, n in enumerate(names):
        if n != f"d{i}":
            raise InputError(f"loops must be named d0, d1, ... in order; found {n!r} at position {i}", where)
    loops = {n: i for i, n in enumerate(names)}
    body = match.group(2).strip()
    results = tuple(_parse_expr(part, loops, where) for part in body.split(",")) if body else ()
    return AffineMap(len(names), results)
