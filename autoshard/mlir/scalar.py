"""Scalar bodies of linalg regions: the payload table's functions as `arith`/`math` ops.

Float payloads use the float ops; integer payloads the signed integer ops, and the payloads
that only exist on reals (exp, tanh, ...) are computed in f64 and converted back, as numpy
computes them on integers. On `i1` only the logical payloads (add/max = or, mul/min = and) exist.
"""

from __future__ import annotations

from typing import Callable

from autoshard.dtypes import DTYPES
from autoshard.errors import InputError
from autoshard.mlir.text import Body, elem_type, float_literal
from autoshard.ops.payloads import payload_dtype_problem
from autoshard.reductions import REDUCTIONS

Emit = Callable[[Body, list[str], str], str]  # (body, scalar operands, dtype) -> result name


def constant(b: Body, value: float, dtype: str, hint: str = "cst") -> str:
    name = b.name(hint)
    if DTYPES[dtype].is_float:
        b.emit(f"{name} = arith.constant {float_literal(value, dtype)} : {elem_type(dtype)}")
    elif dtype == "bool":
        b.emit(f"{name} = arith.constant {'true' if value else 'false'}")
    else:
        b.emit(f"{name} = arith.constant {int(value)} : {elem_type(dtype)}")
    return name


def _op(b: Body, op: str, args: list[str], dtype: str, hint: str) -> str:
    name = b.name(hint)
    b.emit(f"{name} = {op} {', '.join(args)} : {elem_type(dtype)}")
    return name


def _binary(float_op: str, int_op: str) -> Emit:
    def emit(b: Body, args: list[str], dtype: str) -> str:
        return _op(b, float_op if DTYPES[dtype].is_float else int_op, args, dtype, float_op.split(".")[1])
    return emit


def _sigmoid(b: Body, x: str, dtype: str) -> str:
    neg = _op(b, "arith.negf", [x], dtype, "neg")
    e = _op(b, "math.exp", [neg], dtype, "exp")
    one = constant(b, 1.0, dtype, "one")
    den = _op(b, "arith.addf", [one, e], dtype, "den")
    return _op(b, "arith.divf", [one, den], dtype, "sigmoid")


def _gelu(b: Body, x: str, dtype: str) -> str:
    # 0.5 * x * (1 + tanh(0.7978845608028654 * (x + 0.044715 * x^3))), as the payload table.
    x2 = _op(b, "arith.mulf", [x, x], dtype, "x2")
    x3 = _op(b, "arith.mulf", [x2, x], dtype, "x3")
    c1 = constant(b, 0.044715, dtype)
    inner = _op(b, "arith.addf", [x, _op(b, "arith.mulf", [c1, x3], dtype, "t")], dtype, "inner")
    c2 = constant(b, 0.7978845608028654, dtype)
    t = _op(b, "math.tanh", [_op(b, "arith.mulf", [c2, inner], dtype, "t")], dtype, "tanh")
    one = constant(b, 1.0, dtype, "one")
    half = constant(b, 0.5, dtype, "half")
    hx = _op(b, "arith.mulf", [half, x], dtype, "hx")
    return _op(b, "arith.mulf", [hx, _op(b, "arith.addf", [one, t], dtype, "t")], dtype, "gelu")


def _gelu_erf(b: Body, x: str, dtype: str) -> str:
    # 0.5 * x * (1 + erf(x / sqrt(2))), as the payload table.
    scaled = _op(b, "arith.mulf", [x, constant(b, 0.7071067811865476, dtype)], dtype, "t")
    e = _op(b, "math.erf", [scaled], dtype, "erf")
    hx = _op(b, "arith.mulf", [constant(b, 0.5, dtype, "half"), x], dtype, "hx")
    return _op(b, "arith.mulf", [hx, _op(b, "arith.addf", [constant(b, 1.0, dtype, "one"), e], dtype, "t")], dtype, "gelu")


_REAL_ONLY: dict[str, Callable[[Body, str, str], str]] = {
    "exp": lambda b, x, t: _op(b, "math.exp", [x], t, "exp"),
    "log": lambda b, x, t: _op(b, "math.log", [x], t, "log"),
    "sqrt": lambda b, x, t: _op(b, "math.sqrt", [x], t, "sqrt"),
    "rsqrt": lambda b, x, t: _op(b, "math.rsqrt", [x], t, "rsqrt"),
    "tanh": lambda b, x, t: _op(b, "math.tanh", [x], t, "tanh"),
    "sin": lambda b, x, t: _op(b, "math.sin", [x], t, "sin"),
    "cos": lambda b, x, t: _op(b, "math.cos", [x], t, "cos"),
    "gelu": _gelu,
    "erf": lambda b, x, t: _op(b, "math.erf", [x], t, "erf"),
    "gelu_erf": _gelu_erf,
    "sigmoid": _sigmoid,
    "silu": lambda b, x, t: _op(b, "arith.mulf", [x, _sigmoid(b, x, t)], t, "silu"),
}


def _neg(b: Body, args: list[str], dtype: str) -> str:
    if DTYPES[dtype].is_float:
        return _op(b, "arith.negf", args, dtype, "neg")
    return _op(b, "arith.subi", [constant(b, 0, dtype, "zero"), args[0]], dtype, "neg")


def _relu(b: Body, args: list[str], dtype: str) -> str:
    zero = constant(b, 0.0, dtype, "zero")
    return _binary("arith.maximumf", "arith.maxsi")(b, [args[0], zero], dtype)


PAYLOAD_OPS: dict[str, Emit] = {
    "copy": lambda b, args, dtype: args[0],
    "neg": _neg,
    "abs": lambda b, args, dtype: _op(b, "math.absf" if DTYPES[dtype].is_float else "math.absi", args, dtype, "abs"),
    "relu": _relu,
    "square": lambda b, args, dtype: _binary("arith.mulf", "arith.muli")(b, [args[0], args[0]], dtype),
    "add": _binary("arith.addf", "arith.addi"),
    "sub": _binary("arith.subf", "arith.subi"),
    "mul": _binary("arith.mulf", "arith.muli"),
    "div": _binary("arith.divf", "arith.divsi"),
    "max": _binary("arith.maximumf", "arith.maxsi"),
    "min": _binary("arith.minimumf", "arith.minsi"),
    "pow": _binary("math.powf", "math.ipowi"),
}
_LOGICAL = {"copy": "", "add": "arith.ori", "max": "arith.ori", "mul": "arith.andi", "min": "arith.andi"}  # on_bool payloads


def payload(b: Body, name: str, args: list[str], dtype: str, where: str) -> str:
    """Emit payload `name` on scalar operands of `dtype`; returns the result's name."""
    if dtype == "bool":
        problem = payload_dtype_problem(name, dtype)
        if problem:
            raise InputError(problem, where)
        return args[0] if name == "copy" else _op(b, _LOGICAL[name], args, dtype, name)
    if name in _REAL_ONLY:
        if DTYPES[dtype].is_float:
            return _REAL_ONLY[name](b, args[0], dtype)
        real = convert(b, args[0], dtype, "f64")
        return convert(b, _REAL_ONLY[name](b, real, "f64"), "f64", dtype)
    return PAYLOAD_OPS[name](b, args, dtype)


# --- reductions ---------------------------------------------------------------------------

def combine(b: Body, kind: str, acc: str, value: str, dtype: str, where: str) -> str:
    return payload(b, REDUCTIONS[kind].combiner, [acc, value], dtype, where)


def identity_value(kind: str, dtype: str) -> float:
    """The neutral element of reduction `kind` on `dtype` (the init of a reduction's output)."""
    return REDUCTIONS[kind].identity(DTYPES[dtype].numpy).item()


# --- conversions --------------------------------------------------------------------------

def _width(dtype: str) -> int:
    return 1 if dtype == "bool" else 8 * DTYPES[dtype].itemsize


def convert(b: Body, x: str, source: str, target: str) -> str:
    """Convert scalar `x` from `source` to `target` as numpy's astype does."""
    if source == target:
        return x
    s, t = DTYPES[source], DTYPES[target]
    src, dst = elem_type(source), elem_type(target)
    name = b.name("conv")
    if s.is_float and t.is_float:
        if _width(source) == _width(target):  # bf16 <-> f16: through f32
            return convert(b, convert(b, x, source, "f32"), "f32", target)
        op = "arith.extf" if _width(target) > _width(source) else "arith.truncf"
        b.emit(f"{name} = {op} {x} : {src} to {dst}")
    elif target == "bool":
        zero = constant(b, 0, source, "zero")
        predicate = "arith.cmpf une" if s.is_float else "arith.cmpi ne"
        b.emit(f"{name} = {predicate}, {x}, {zero} : {src}")
    elif t.is_float:
        b.emit(f"{name} = {'arith.uitofp' if source == 'bool' else 'arith.sitofp'} {x} : {src} to {dst}")
    elif s.is_float:
        b.emit(f"{name} = arith.fptosi {x} : {src} to {dst}")
    else:
        op = ("arith.extui" if source == "bool" else "arith.extsi") if _width(target) > _width(source) else "arith.trunci"
        b.emit(f"{name} = {op} {x} : {src} to {dst}")
    return name
