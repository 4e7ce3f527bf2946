"""A JAX function and example arguments in, an `autoshard.graph/v1` document out.

`from_function(f, *args)` traces `f` (`trace`), drops the equations no result depends on, and
turns each remaining equation into graph ops through its row of `primitives`. Arguments become
tensors named by their pytree paths (`params['layers'][0]['wq']`), so shardings go back into the
user's pytree; leaves of the arguments in `parameters` (default: the first of several, as in
`loss(params, batch)`) are parameters, the others inputs. Literals and closed-over constants
become inputs pinned replicated (XLA holds them whole on every device); the document carries the
contents of the small, finite ones, so evaluating the graph uses the program's numbers (a drawn
scale under `rsqrt` would be NaN half the time).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from autoshard.dtypes import DTYPES
from autoshard.errors import InputError
from autoshard.frontends.jax.primitives import DTYPE_NAMES, PRIMITIVES
from autoshard.frontends.jax.rows import Unsupported
from autoshard.frontends.layering import graph_keeping_what_holds, tag_layers
from autoshard.frontends.jax.trace import Atom, Const, FlatEqn, FlatProgram, trace
from autoshard.frontends.user_code import SOURCE, call_factory, load_user_factory
from autoshard.graph.builder import GraphBuilder, constant_value
from autoshard.ops import OpError


class UnsupportedPrimitiveWarning(UserWarning):
    """Primitives imported as opaque ops, kept whole on every device."""


@dataclass(frozen=True)
class Imported:
    """The graph of a program and where each of its values went."""

    document: dict[str, Any]
    program: FlatProgram
    tensors: dict[int, str]  # value id -> graph tensor, for every value the graph holds
    # eqn index -> (position of the eqn operand, graph op, input index of that op) for the graph
    # ops that read an eqn operand directly
    reads: dict[int, list[tuple[int, str, int]]]
    outputs: list[str | None]  # the graph tensor of each result leaf (None: a constant)
    opaque: dict[str, int]  # primitive -> how many of its equations became opaque ops
    constants: dict[str, np.ndarray]  # the value of each constant input (literals, closed-over arrays)


class _Emitter:
    """The `Emit` rows see: a builder, plus the tensors of the program's values and constants."""

    def __init__(self, builder: GraphBuilder, program: FlatProgram):
        self.b, self.program = builder, program
        self.tensors: dict[int, str] = {}
        self.constants: dict[int, str] = {}  # Const index -> tensor
        self.values: dict[str, np.ndarray] = {}  # constant tensor -> its value
        self.reads: list[tuple[int, str, int]] = []
        self.operands: dict[str, int] = {}  # graph tensor of an operand of the current eqn -> its position
        self.name = ""

    def dtype(self, atom: Atom) -> str:
        return graph_dtype(self.program.dtype(atom), f"value {atom}")

    def shape(self, atom: Atom) -> tuple[int, ...]:
        return self.program.shape(atom)

    def tensor(self, atom: Atom) -> str:
        if isinstance(atom, Const):
            if atom.index not in self.constants:
                self.constants[atom.index] = self.constant(atom.value, graph_dtype(atom.value.dtype, "a constant"))
            return self.constants[atom.index]
        return self.tensors[atom]

    def constant(self, value: Any, dtype: str) -> str:
        array = np.asarray(value, DTYPES[dtype].numpy)
        tensor = self.b.input(f"const{len(self.values)}", array.shape, dtype, value=constant_value(array))
        self.values[tensor] = array
        return tensor

    def op(self, kind: str, inputs: Sequence[str], **attrs: Any) -> str:
        result = self.b.op(kind, inputs, self.name, **attrs)
        self.reads.extend((self.operands[t], result, i) for i, t in enumerate(inputs) if t in self.operands)
        return result


def graph_dtype(dtype: np.dtype, where: str) -> str:
    name = DTYPE_NAMES.get(str(np.dtype(dtype)))
    if name is None:
        raise InputError(f"element type {np.dtype(dtype)} has no graph dtype; supported: {sorted(DTYPE_NAMES)}", where)
    return name


def live_eqns(program: FlatProgram) -> list[int]:
    """Indices of the equations some result depends on, in program order."""
    needed = {a for a in program.outputs if isinstance(a, int)}
    live = []
    for index in reversed(range(len(program.eqns))):
        eqn = program.eqns[index]
        if needed.intersection(eqn.outputs):
            live.append(index)
            needed.update(a for a in eqn.inputs if isinstance(a, int))
    return live[::-1]


def import_program(program: FlatProgram, name: str, parameters: Sequence[int] | None = None,
                   strict: bool = False) -> Imported:
    """The graph of `program`; `parameters` are the argument numbers holding parameters."""
    if parameters is None:
        parameters = (0,) if len({a.argnum for a in program.arguments}) > 1 else ()
    builder = GraphBuilder(name, "f32")
    emit = _Emitter(builder, program)
    for argument in program.arguments:
        declare = builder.parameter if argument.argnum in parameters else builder.input
        emit.tensors[argument.id] = declare(argument.path, argument.shape, graph_dtype(argument.dtype, argument.path))
    reads: dict[int, list[tuple[int, str, int]]] = {}
    opaque: dict[str, int] = {}
    for index in live_eqns(program):
        eqn = program.eqns[index]
        primitive = eqn.primitive.name
        emit.name, emit.reads = primitive, []
        builder.module = eqn.scope
        emit.operands = {emit.tensor(a): position for position, a in enumerate(eqn.inputs)}
        row = PRIMITIVES.get(primitive)
        reason = "no row in the primitive table"
        results = None
        if row is not None:
            try:
                results = row(emit, eqn)
            except (Unsupported, OpError) as error:  # raised before the row adds an op
                reason = str(error)
        if results is None:
            if strict:
                raise InputError(f"primitive {primitive!r} cannot be imported ({reason}); without strict it "
                                 "becomes an opaque op, kept whole on every device", f"eqn {index}: {primitive}")
            opaque[primitive] = opaque.get(primitive, 0) + 1
            results = [_opaque(emit, eqn, program, primitive, k) for k in range(len(eqn.outputs))]
        emit.tensors.update(zip(eqn.outputs, results))
        reads[index] = emit.reads
    if opaque:
        warnings.warn("imported as opaque ops, kept whole on every device: "
                      + ", ".join(f"{p} ({n}x)" for p, n in sorted(opaque.items())), UnsupportedPrimitiveWarning,
                      stacklevel=3)
    builder.module = ""
    tag_layers(builder)
    outputs = [emit.tensors[a] if isinstance(a, int) else None for a in program.outputs]
    builder.mark_outputs(*(t for t in outputs if t is not None))
    document = builder.document()
    document["constraints"] = [{"tensor": t, "split_axes": [], "required": True} for t in emit.values]
    graph_keeping_what_holds(document)  # drops layers that cannot be cut into stages
    return Imported(document, program, dict(emit.tensors), reads, outputs, opaque, emit.values)


def _opaque(emit: _Emitter, eqn: FlatEqn, program: FlatProgram, primitive: str, result: int) -> str:
    out = eqn.outputs[result]
    inputs = [emit.tensor(a) for a in eqn.inputs]
    return emit.op("opaque", inputs, shape=list(program.shape(out)), dtype=emit.dtype(out), primitive=primitive)


def from_function(f: Callable[..., Any], *args: Any, name: str | None = None, parameters: Sequence[int] | None = None,
                  strict: bool = False) -> dict[str, Any]:
    """The `autoshard.graph/v1` document of `f(*args)` (see the module docstring). `strict`: a
    primitive the graph cannot express is an error instead of an opaque op with a warning."""
    return import_function(f, args, name, parameters, strict).document


def import_function(f: Callable[..., Any], args: Sequence[Any], name: str | None = None,
                    parameters: Sequence[int] | None = None, strict: bool = False) -> Imported:
    """`from_function`, keeping the program and where its values went (what `shard` needs)."""
    name = name or getattr(f, "__name__", None) or "jax_function"
    return import_program(trace(f, args), name, parameters, strict)


def load_factory(spec: str) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """`FILE.py:FACTORY` -> what `FACTORY()` returns: `(f, args)`, `args` a tuple."""
    path, factory = load_user_factory(spec)
    made = call_factory(path, factory)
    if not (isinstance(made, tuple) and len(made) == 2 and callable(made[0]) and isinstance(made[1], tuple)):
        raise InputError(f"{factory.__name__}() must return (f, args) with args a tuple, got {type(made).__name__}",
                         SOURCE)
    return made


def import_factory(spec: str, strict: bool = False) -> dict[str, Any]:
    """The graph document of the function `FILE.py:FACTORY` makes (`autoshard import jax`)."""
    f, args = load_factory(spec)
    return from_function(f, *args, name=getattr(f, "__name__", None) or spec.rpartition(":")[2], strict=strict)
