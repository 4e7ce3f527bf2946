"""What a row of the primitive table is: a function of an `Emit` (which adds ops to the graph
being built and names the tensors of the equation's operands) and the equation, returning the
graph tensor of each result, or raising `Unsupported` (or the op table's `OpError`) before it
adds any op."""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence

from autoshard.frontends.jax.trace import Atom, FlatEqn


class Emit(Protocol):
    """What a row may do: read operands as graph tensors and add ops."""

    def tensor(self, atom: Atom) -> str: ...

    def constant(self, value: Any, dtype: str) -> str: ...

    def op(self, kind: str, inputs: Sequence[str], **attrs: Any) -> str: ...

    def shape(self, atom: Atom) -> tuple[int, ...]: ...

    def dtype(self, atom: Atom) -> str: ...


Row = Callable[[Emit, FlatEqn], list[str]]  # raises (Unsupported, OpError) before adding any op


class Unsupported(Exception):
    """This equation of a known primitive has no graph ops; the message says why."""
