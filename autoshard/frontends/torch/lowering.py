"""What a row of the aten table writes into: graph ops, and beside each the PyTorch call that
computes the same value, so that a plan can be run op by op under DTensor.

Each graph op is one step: `call` takes the torch values of the op's inputs (plain tensors, or
DTensors laid out as the plan says) and returns its result. An aten op may become several graph
ops (`linear` with a bias is a contraction, then the bias added once after it); each of those is
a step of its own, so PyTorch sees exactly the values the plan places.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from autoshard.dtypes import DTYPES as GRAPH_DTYPES
from autoshard.graph.builder import GraphBuilder, constant_value

# torch dtype name -> ours
DTYPES = {"float64": "f64", "float32": "f32", "bfloat16": "bf16", "float16": "f16", "float8_e4m3fn": "f8",
          "int64": "i64", "int32": "i32", "bool": "bool"}


class Unsupported(Exception):
    """A row cannot lower this use of its op (an argument outside what it handles): the importer
    keeps the node opaque instead, with this reason."""


@dataclass(frozen=True)
class Step:
    outputs: tuple[str, ...]  # a graph op's result (named like the op); an opaque node's values ("" if not a tensor)
    inputs: tuple[str, ...]
    call: Callable[..., Any]
    opaque: bool = False  # computed by PyTorch on whole values, outside the plan


@dataclass
class Lowering:
    builder: GraphBuilder
    values: dict[str, str] = field(default_factory=dict)  # FX node name -> graph tensor holding its value
    steps: list[Step] = field(default_factory=list)
    # rank-0 graph inputs standing for the Python scalars of the program: name -> (value, dtype)
    scalars: dict[str, tuple[Any, str]] = field(default_factory=dict)
    # FX values with a zero-size dim (the pass-through part of a rotary that covers the whole
    # head): no graph tensor holds them, they hold nothing to place or compute. name -> the value
    empty: dict[str, Any] = field(default_factory=dict)
    # graph inputs holding the program's constant tensors (an index written in the model's code):
    # name -> the value, for rows whose lowering depends on a constant's numbers
    constants: dict[str, Any] = field(default_factory=dict)

    def tensor(self, arg: Any) -> str:
        """The graph tensor of an FX node argument."""
        name = getattr(arg, "name", None)
        if name in self.empty:
            raise Unsupported(f"argument {name} is empty (shape {list(self.empty[name].shape)})")
        if name not in self.values:
            raise Unsupported(f"argument {arg!r} is not a tensor value")
        return self.values[name]

    def shape(self, tensor: str) -> tuple[int, ...]:
        return self.builder.shape(tensor)

    def op(self, kind: str, inputs: list[str], name: str, call: Callable[..., Any], **attrs: Any) -> str:
        """Add a graph op of `kind` and the step that computes it in PyTorch."""
        out = self.builder.op(kind, inputs, name, **attrs)
        self.steps.append(Step((out,), tuple(inputs), call))
        return out

    def scalar(self, value: Any, like: str, name: str, dtype: str | None = None) -> str:
        """A Python number operand as a rank-0 input of the dtype of tensor `like` (or `dtype`),
        carrying the number (if finite) for evaluation; the runner feeds the number itself."""
        dtype = dtype or self.builder.dtype_of(like)
        number = constant_value(np.asarray(value, GRAPH_DTYPES[dtype].numpy))
        tensor = self.builder.input(name, (), dtype, value=number)
        self.scalars[tensor] = (value, dtype)
        return tensor

    def operand(self, arg: Any, like: str, name: str) -> str:
        """A tensor argument's graph tensor, or a number as a scalar input."""
        if isinstance(arg, (int, float)) and not isinstance(arg, bool):
            return self.scalar(arg, like, name)
        return self.tensor(arg)
