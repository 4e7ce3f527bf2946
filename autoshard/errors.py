"""The small exception tree of autoshard.

Every error a user can cause carries one or more `Problem`s: where (a JSON pointer or a
name) and what was expected. The CLI prints them and exits 2; the service maps them to 4xx.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with an input: `where` is a JSON pointer or a name, `message` says what."""

    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}" if self.where else self.message


def json_type(value: object) -> str:
    """What a parsed JSON value is, in the words of a message: "a string", "null", ..."""
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null",
             int: "a number", float: "a number"}
    return names.get(type(value), type(value).__name__)


class AutoshardError(Exception):
    """Base of every error autoshard raises on purpose."""


class InputError(AutoshardError):
    """The user's input is malformed; carries every problem found, not only the first."""

    def __init__(self, problems: list[Problem] | Problem | str, where: str = ""):
        if isinstance(problems, str):
            problems = [Problem(where, problems)]
        elif isinstance(problems, Problem):
            problems = [problems]
        self.problems: list[Problem] = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems))


class ShardingError(InputError):
    """A sharding does not fit its tensor or mesh (unknown axis, axis used twice, rank)."""


class InfeasibleError(AutoshardError):
    """No plan satisfies the pins and the memory budget; the message says which conflicts."""


class Interrupted(AutoshardError):
    """Stopped by a signal (Ctrl-C, SIGTERM) before it finished; the message says what was kept."""


class OutOfTime(AutoshardError):
    """A time budget ran out before any answer was found: not a proof that there is none."""
