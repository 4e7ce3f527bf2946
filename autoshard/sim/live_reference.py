"""The reference evaluator's values as a simulation reads them: a tensor is computed when a check
first asks for it (with the values it needs and nothing else), and dropped once its last expected
reader has read it: a check, or an op computing another value some check needs.

A pipelined step holds every microbatch in flight at once; holding each one's whole evaluation
(and the whole batch's) grows with every value the step ever makes, this with what is live.
Dropping only saves memory: a value asked for again after its foreseen reads (a check not
counted in `expected_reads`) is computed again from the inputs, so a check always sees exactly
what `evaluate_graph` would give it.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Iterable, Iterator, Mapping

import numpy as np

from autoshard.dtypes import DTYPES
from autoshard.graph.model import Graph, Op
from autoshard.ops import evaluate
from autoshard.sim.precision import widen_dtype


def expected_reads(graph: Graph, checked: Iterable[str]) -> Counter[str]:
    """How often each tensor is read when every tensor of `checked` (one entry per check) is
    compared: its checks, plus one per op computing a tensor that some check needs."""
    reads = Counter(checked)
    needed: set[str] = set()  # names of the ops the checked tensors depend on
    stack = [graph.producers[t] for t in reads if t in graph.producers]
    while stack:
        op = stack.pop()
        if op.name in needed:
            continue
        needed.add(op.name)
        reads.update(set(op.inputs))
        stack.extend(graph.producers[t] for t in op.inputs if t in graph.producers)
    return reads


def evaluation_peak_bytes(graph: Graph, widen: bool = True) -> int:
    """The most bytes of computed values an evaluation of `graph` in its order holds when each is
    dropped after its last reader, as a `LiveReference` asked for every value holds them (the
    inputs, the caller's, left out); floats counted as float64 when `widen`."""
    def nbytes(name: str) -> int:
        tensor = graph.tensors[name]
        dtype = widen_dtype(tensor.dtype) if widen else tensor.dtype
        return math.prod(tensor.shape) * np.dtype(DTYPES[dtype].numpy).itemsize

    last = {name: step for step, op in enumerate(graph.order) for name in op.inputs}
    held = peak = 0
    for step, op in enumerate(graph.order):
        held += sum(nbytes(name) for name in op.outputs)
        peak = max(peak, held)
        held -= sum(nbytes(name) for name in {*op.inputs, *op.outputs}
                    if graph.tensors[name].role == "intermediate" and last.get(name, step) == step)
    return peak


class LiveReference(Mapping[str, np.ndarray]):
    """The reference values of `graph` on `inputs`, each read (`reference[name]`) counted
    against `reads` (from `expected_reads`, copied): a value goes when its count is spent."""

    def __init__(self, graph: Graph, inputs: Mapping[str, np.ndarray], reads: Counter[str]):
        self._graph, self._inputs = graph, inputs
        self._pending = Counter(reads)
        self._evaluated: set[str] = set()  # ops evaluated once: computing a value again spends no read
        self._values: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        if name in self._inputs:
            return self._inputs[name]
        if name not in self._values:
            self._compute(name)
        value = self._values[name]
        self._spend(name)
        return value

    def __iter__(self) -> Iterator[str]:  # what is held now: inputs and the values still to be read
        return iter({**self._inputs, **self._values})

    def __len__(self) -> int:
        return len(self._inputs) + len(self._values)

    def held_bytes(self) -> int:
        """Bytes of the computed values held now (the inputs are the caller's)."""
        return sum(value.nbytes for value in self._values.values())

    def _compute(self, name: str) -> None:
        """Evaluate `name`'s producer after whatever it reads that is not held, depth first. A
        value an op on the stack still waits for is not dropped when its count is spent (it may
        be one computed again); those and the values made here that no count holds are dropped
        at the end."""
        if name not in self._graph.producers:
            raise KeyError(name)
        made: set[str] = set()
        spared: set[str] = set()
        waiting: Counter[str] = Counter()  # inputs of the ops on the stack
        stack: list[Op] = []

        def push(op: Op) -> None:
            stack.append(op)
            waiting.update(set(op.inputs))

        push(self._graph.producers[name])
        while stack:
            op = stack[-1]
            missing = [t for t in dict.fromkeys(op.inputs) if t not in self._inputs and t not in self._values]
            if missing:
                for t in missing:
                    push(self._graph.producers[t])
                continue
            stack.pop()
            waiting.subtract(set(op.inputs))
            if all(t in self._values for t in op.outputs):  # pushed twice, computed once
                continue
            results = evaluate(op.op_kind, op.nest, op.attrs, [self._read(t) for t in op.inputs])
            for output, value in zip(op.outputs, results):
                self._values[output] = np.asarray(value).astype(DTYPES[self._graph.tensors[output].dtype].numpy,
                                                                copy=False)
                made.add(output)
            if op.name not in self._evaluated:
                self._evaluated.add(op.name)
                for t in set(op.inputs):
                    if self._spend(t, waiting):
                        spared.add(t)
        for left in made | spared:
            if left != name and self._pending[left] <= 0:
                self._values.pop(left, None)

    def _read(self, name: str) -> np.ndarray:
        return self._inputs[name] if name in self._inputs else self._values[name]

    def _spend(self, name: str, waiting: Counter[str] | None = None) -> bool:
        """One expected read of `name` done: drop its value when none is left, unless an op in
        `waiting` still reads it: then say so (True)."""
        self._pending[name] -= 1
        if self._pending[name] > 0:
            return False
        if waiting is not None and waiting[name] > 0:
            return True
        self._values.pop(name, None)
        return False
