"""Scalar bodies of `generic` ops and elementwise kinds.

A payload is an elementwise function of its operands. How a `generic` op uses it:

- no reduction loops: `out = payload(in_0, ..., in_{n-1})`, so the payload's arity is the
  number of inputs;
- with reduction loops and arity `n`: every point computes `v = payload(inputs...)` and the
  results are combined with the op's reduction kind (`sum` unless the iterator says
  `reduction_max`, ...): `out = combine(v over the reduction loops)` (a matmul is `mul` + sum);
- with reduction loops and arity `n + 1` (the linalg style, `acc = payload(in, acc)`): the
  payload *is* the combiner, so it must be one of `add`, `mul`, `max`, `min`, and the value
  folded is the single input (`add` over one input is a sum-reduction).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from autoshard.reductions import BY_COMBINER


def _gelu(x: np.ndarray) -> np.ndarray:
    # tanh approximation, as used by GPT-2/3
    return 0.5 * x * (1.0 + np.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))


_ERF = np.frompyfunc(math.erf, 1, 1)  # numpy has no erf; math's is exact to the double


def _erf(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    return _ERF(x).astype(x.dtype)


def _gelu_erf(x: np.ndarray) -> np.ndarray:
    # the exact form, torch's default: x * Phi(x), Phi the normal distribution function
    return 0.5 * x * (1.0 + _erf(x * np.asarray(0.7071067811865476, x.dtype)))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


@dataclass(frozen=True, slots=True)
class Payload:
    name: str
    arity: int
    fn: Callable[..., np.ndarray]
    flops: int = 1  # per element, for the compute model
    on_bool: bool = False  # has a logical meaning on bool values (add/max: or, mul/min: and)

    @property
    def combiner_of(self) -> str | None:
        """The reduction kind this payload is the combiner of, if any."""
        reduction = BY_COMBINER.get(self.name)
        return reduction.name if reduction is not None else None


PAYLOADS: dict[str, Payload] = {p.name: p for p in (
    Payload("copy", 1, lambda x: x, 0, on_bool=True),
    Payload("neg", 1, np.negative),
    Payload("abs", 1, np.abs),
    Payload("exp", 1, np.exp, 4),
    Payload("log", 1, np.log, 4),
    Payload("sqrt", 1, np.sqrt, 2),
    Payload("rsqrt", 1, lambda x: 1.0 / np.sqrt(x), 2),
    Payload("tanh", 1, np.tanh, 4),
    Payload("sin", 1, np.sin, 4),
    Payload("cos", 1, np.cos, 4),
    Payload("relu", 1, lambda x: np.maximum(x, 0), 1),
    Payload("gelu", 1, _gelu, 8),
    Payload("erf", 1, _erf, 4),
    Payload("gelu_erf", 1, _gelu_erf, 8),
    Payload("sigmoid", 1, _sigmoid, 4),
    Payload("silu", 1, lambda x: x * _sigmoid(x), 5),
    Payload("square", 1, np.square),
    Payload("add", 2, np.add, on_bool=True),
    Payload("sub", 2, np.subtract),
    Payload("mul", 2, np.multiply, on_bool=True),
    Payload("div", 2, np.divide),
    Payload("max", 2, np.maximum, on_bool=True),
    Payload("min", 2, np.minimum, on_bool=True),
    Payload("pow", 2, np.power, 4),
)}

def payload_dtype_problem(name: str, dtype: str) -> str | None:
    """Why payload `name` cannot compute on `dtype` values, or None: a bool has only the logical
    payloads (the IR has no arithmetic on i1)."""
    if dtype == "bool" and not PAYLOADS[name].on_bool:
        return (f"payload {name!r} has no meaning on bool values; bool values take "
                f"{[n for n, p in PAYLOADS.items() if p.on_bool]}")
    return None


UNARY = tuple(n for n, p in PAYLOADS.items() if p.arity == 1 and n != "copy")
BINARY = tuple(n for n, p in PAYLOADS.items() if p.arity == 2)
