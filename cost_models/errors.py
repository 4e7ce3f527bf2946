"""Errors of the cost models: every one names the field it is about.

`TopologyError` is a `ValueError` carrying `(field, message)`; callers that speak in terms of
user input (the autoshard CLI and service) turn it into their own input errors. A profile file
can have several problems at once: they all travel in `problems`, the first one also in
`field`/`message`.
"""

from __future__ import annotations

from typing import Sequence


class TopologyError(ValueError):
    """A hardware profile, binding or collective request that cannot be priced."""

    def __init__(self, field: str, message: str, *, more: Sequence[tuple[str, str]] = ()):
        self.field = field
        self.message = message
        self.problems: tuple[tuple[str, str], ...] = ((field, message), *more)
        super().__init__("; ".join(f"{f}: {m}" if f else m for f, m in self.problems))


class ProfileError(TopologyError):
    """A topology profile is missing, malformed or inconsistent."""


class BindingError(TopologyError):
    """A logical mesh does not fit the machine (sizes do not factor, mesh too large, bad mapping)."""
