"""A function's jaxpr as one flat program: nested `jit`, `custom_jvp_call`, `custom_vjp_call` and
`checkpoint` calls inlined, `scan`s unrolled, closed-over constants and literals as `Const`s, every
value an integer id.

A `scan` (how stacked layers are written: parameters stacked on a leading layer axis, the body one
layer) becomes its iterations, one after another: each reads its slice of the stacked operands
(`slice` + `squeeze` of index i) and runs the body under the scope `scan.<i>`, so the importer
numbers each iteration as a layer of its own; the stacked results are `concatenate`d back.

The importer turns the program into graph ops and `shard` evaluates it again under the plan's
shardings: both walk this one list, so a value's graph tensor is found by its id.
"""

from __future__ import annotations

import re

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from autoshard.errors import InputError
from autoshard.frontends.jax.runtime import require_jax
from autoshard.frontends.user_code import as_user_error, source_file

# Call primitives whose body is inlined, with the parameter holding the body. Their custom
# differentiation rules do not matter here: a gradient the user takes is already in the jaxpr.
INLINED = {"jit": "jaxpr", "pjit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr",
           "custom_jvp_call": "call_jaxpr", "custom_vjp_call": "call_jaxpr", "remat2": "jaxpr", "checkpoint": "jaxpr"}


@dataclass(frozen=True)
class Const:
    """A literal or a closed-over constant."""

    value: np.ndarray = field(compare=False)
    index: int  # position among the program's constants


Atom = int | Const  # a value id, or a constant


@dataclass(frozen=True)
class Argument:
    id: int
    path: str  # the pytree path, spelled from the function's parameter names: params['w1']
    argnum: int
    shape: tuple[int, ...]
    dtype: np.dtype


@dataclass(frozen=True)
class FlatEqn:
    primitive: Any  # a jax Primitive
    params: dict[str, Any]
    inputs: tuple[Atom, ...]
    outputs: tuple[int, ...]
    scope: str = ""  # the named scopes the equation was traced in, outermost first (`blocks.layers.0`)


@dataclass
class FlatProgram:
    arguments: list[Argument]
    eqns: list[FlatEqn]
    outputs: list[Atom]
    out_tree: Any  # the pytree structure of the function's result
    in_tree: Any  # the pytree structure of the arguments tuple
    avals: dict[int, tuple[tuple[int, ...], np.dtype]]  # value id -> (shape, dtype)
    consts: list[Const]

    def shape(self, atom: Atom) -> tuple[int, ...]:
        return tuple(atom.value.shape) if isinstance(atom, Const) else self.avals[atom][0]

    def dtype(self, atom: Atom) -> np.dtype:
        return atom.value.dtype if isinstance(atom, Const) else self.avals[atom][1]


def argument_paths(f: Callable[..., Any], args: Sequence[Any]) -> list[tuple[str, int]]:
    """Each leaf's path and argument number: `params['layers'][0]['wq']`, with positional arguments
    named after `f`'s parameters where its signature gives them (else `args[i]`)."""
    jax = require_jax()
    try:
        names = [p.name for p in inspect.signature(f).parameters.values()
                 if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):  # builtins and some wrappers have no signature
        names = []
    paths = []
    for argnum, arg in enumerate(args):
        head = names[argnum] if argnum < len(names) else f"args[{argnum}]"
        for path, _ in jax.tree_util.tree_flatten_with_path(arg)[0]:
            paths.append((head + jax.tree_util.keystr(path), argnum))
    return paths


def trace(f: Callable[..., Any], args: Sequence[Any]) -> FlatProgram:
    """The flat program of `f(*args)`; `args` may hold arrays or `jax.ShapeDtypeStruct`s."""
    jax = require_jax()
    if not callable(f):
        raise InputError(f"expected a function, got {type(f).__name__}", "f")
    # what f raises while traced (a shape mismatch, Python control flow on a traced value) is the user's
    with as_user_error(source_file(f), f"tracing {getattr(f, '__name__', 'the function')}"):
        closed, out_shape = jax.make_jaxpr(f, return_shape=True)(*args)
    leaves, in_tree = jax.tree_util.tree_flatten(tuple(args))
    paths = argument_paths(f, args)
    flat = _Flattener()
    arguments = []
    for var, (path, argnum), leaf in zip(closed.jaxpr.invars, paths, leaves):
        value_id = flat.new(var.aval)
        arguments.append(Argument(value_id, path, argnum, tuple(var.aval.shape), np.dtype(var.aval.dtype)))
    outputs = flat.inline(closed.jaxpr, [a.id for a in arguments], [flat.const(c) for c in closed.consts])
    return FlatProgram(arguments, flat.eqns, outputs, jax.tree_util.tree_structure(out_shape), in_tree,
                       flat.avals, flat.consts)


class _Flattener:
    def __init__(self) -> None:
        self.eqns: list[FlatEqn] = []
        self.avals: dict[int, tuple[tuple[int, ...], np.dtype]] = {}
        self.consts: list[Const] = []

    def new(self, aval: Any) -> int:
        value_id = len(self.avals)
        self.avals[value_id] = (tuple(aval.shape), np.dtype(aval.dtype))
        return value_id

    def const(self, value: Any, dtype: Any = None) -> Const:
        const = Const(np.asarray(value, dtype=dtype), len(self.consts))
        self.consts.append(const)
        return const

    def inline(self, jaxpr: Any, inputs: Sequence[Atom], consts: Sequence[Atom], scope: str = "") -> list[Atom]:
        jax_core = require_jax("jax.extend.core")
        env: dict[Any, Atom] = dict(zip(jaxpr.constvars, consts))
        env.update(zip(jaxpr.invars, inputs))

        def read(var: Any) -> Atom:
            if isinstance(var, jax_core.Literal):
                return self.const(var.val, var.aval.dtype)
            return env[var]

        for eqn in jaxpr.eqns:
            ins = [read(v) for v in eqn.invars]
            body = eqn.params.get(INLINED.get(eqn.primitive.name, ""))
            where = ".".join(part for part in (scope, scope_path(str(eqn.source_info.name_stack))) if part)
            if eqn.primitive.name == "scan":
                outs = self.unroll(eqn, ins, where)
            elif body is not None:
                if isinstance(body, jax_core.ClosedJaxpr):
                    outs = self.inline(body.jaxpr, ins, [self.const(c) for c in body.consts], where)
                else:
                    outs = self.inline(body, ins, [], where)
            else:
                outs = [self.new(v.aval) for v in eqn.outvars]
                self.eqns.append(FlatEqn(eqn.primitive, dict(eqn.params), tuple(ins), tuple(outs), where))  # type: ignore[arg-type]
            env.update(zip(eqn.outvars, outs))
        return [read(v) for v in jaxpr.outvars]

    def unroll(self, eqn: Any, ins: Sequence[Atom], scope: str) -> list[Atom]:
        """A scan's iterations inlined in the order it runs them; the results are the last carry
        and the iterations' outputs stacked on a new leading axis."""
        lax = require_jax("jax.lax")
        length, num_consts, num_carry = eqn.params["length"], eqn.params["num_consts"], eqn.params["num_carry"]
        if length == 0:
            raise InputError("a scan of length 0 has no iteration to import", f"scan at {scope or 'top level'}")
        body = eqn.params["jaxpr"]
        body_consts = [self.const(c) for c in body.consts]
        consts, carry = list(ins[:num_consts]), list(ins[num_consts:num_consts + num_carry])
        stacked = ins[num_consts + num_carry:]
        steps = range(length - 1, -1, -1) if eqn.params["reverse"] else range(length)
        outputs: dict[int, list[Atom]] = {}
        for i in steps:
            where = f"{scope}.scan.{i}" if scope else f"scan.{i}"
            xs = [self.call(lambda a, i=i: lax.index_in_dim(a, i, 0, keepdims=False), [x], where)[0] for x in stacked]
            outs = self.inline(body.jaxpr, consts + carry + xs, body_consts, where)
            carry, outputs[i] = outs[:num_carry], outs[num_carry:]
        ys = [self.call(lambda *parts: lax.concatenate([lax.expand_dims(p, (0,)) for p in parts], 0),
                        [outputs[i][k] for i in range(length)], scope)[0]
              for k in range(len(eqn.outvars) - num_carry)]
        return carry + ys

    def call(self, f: Callable[..., Any], ins: Sequence[Atom], scope: str) -> list[Atom]:
        """`f` traced on the shapes of `ins` and inlined on them."""
        jax = require_jax()
        shapes = [jax.ShapeDtypeStruct(*self.aval(a)) for a in ins]
        closed = jax.make_jaxpr(f)(*shapes)
        return self.inline(closed.jaxpr, ins, [self.const(c) for c in closed.consts], scope)

    def aval(self, atom: Atom) -> tuple[tuple[int, ...], np.dtype]:
        return (tuple(atom.value.shape), atom.value.dtype) if isinstance(atom, Const) else self.avals[atom]


_TRANSFORM = re.compile(r"(\w+)\(([^()]*)\)")


def scope_path(name_stack: str) -> str:
    """A name stack as a dotted path of its scopes: the transformations around them dropped
    (`transpose(jvp(blocks/layers.0))` -> `blocks.layers.0`), so a gradient's ops keep the
    scope of the forward ops they differentiate."""
    while True:
        unwrapped = _TRANSFORM.sub(r"\2", name_stack)
        if unwrapped == name_stack:
            return ".".join(part for part in name_stack.split("/") if part)
        name_stack = unwrapped
