"""An `SpmdProgram` being rewritten in place: the collective optimisations edit a `Draft` and
keep or undo each edit, so that an edit costs time in proportion to what it touches, not to the
program's length.

Instructions have stable keys (their index in the original body; new ones get fresh keys) and
an order label (a number between their neighbours' labels), so a rewrite site keeps its name
through edits elsewhere and sites can be visited in program order. The use-def maps, the
communication seconds and the per-device FLOPs are kept up to date through every edit, and
every edit records what it touched (the instructions whose rewrite sites it may have changed).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction

from autoshard.sharding import Sharding
from autoshard.spmd.program import (Communicate, Instruction, SpmdProgram, Value, canonical, check_program,
                                    check_step_values)
from autoshard.spmd.surgery import RESULT, local_op_flops


@dataclass(frozen=True, slots=True)
class Mark:
    """A point to roll a draft back to."""

    log_length: int
    touched_length: int
    communication_s: float
    flops: float


class Draft:
    """A program under rewriting. `body[key]` is an instruction; `producer[value_id]` the key of the
    instruction making a value (absent for arguments); `users[value_id]` the keys reading it
    (`RESULT` for a program result)."""

    def __init__(self, program: SpmdProgram):
        self.original = program
        self.mesh, self.graph, self.price = program.mesh, program.graph, program.price
        self.arguments, self.results = program.arguments, program.results
        self.body: dict[int, Instruction] = {}
        self.producer: dict[int, int] = {}
        self.users: dict[int, set[int]] = {}
        self._label: dict[int, Fraction | int] = {}
        self._prev: dict[int, int | None] = {}
        self._next: dict[int, int | None] = {}
        self._first: int | None = None
        self._last: int | None = None
        self._argument_ids = {v.id for v in program.arguments}
        self._next_key = 0
        self._next_id = program.next_id()
        self._log: list[tuple] = []
        self._touched: list[int] = []
        self.communication_s = 0.0
        self.flops = 0.0
        for instruction in program.body:
            self._attach(self._new_key(), instruction, self._last, log=False)
        for value in self.results:
            self.users.setdefault(value.id, set()).add(RESULT)

    # --- reading ---------------------------------------------------------------------------

    def keys_in_order(self) -> list[int]:
        keys, key = [], self._first
        while key is not None:
            keys.append(key)
            key = self._next[key]
        return keys

    def label(self, key: int) -> Fraction | int:
        return self._label[key]

    def cost(self) -> tuple[float, float]:
        """Communication seconds, then per-device FLOPs: what the optimisations lower."""
        return self.communication_s, self.flops

    def program(self) -> SpmdProgram:
        """The draft as a program."""
        body = tuple(self.body[key] for key in self.keys_in_order())
        program = replace(self.original, body=body, results=tuple(self.results))
        check_program(program)
        return program

    # --- editing ---------------------------------------------------------------------------

    def new_value(self, like: Value, sharding: Sharding) -> Value:
        """A fresh SSA value of `like`'s tensor (ids are never reused, so an undone edit needs none back)."""
        self._next_id += 1
        return Value(self._next_id - 1, like.tensor, canonical(self.mesh, sharding), like.shape, like.dtype)

    def edit(self, remove: set[int], insert: dict[int, list[Instruction]],
             substitute: dict[int, Value] | None = None) -> dict[int, list[int]]:
        """Put `insert[k]` just before instruction `k`, make every instruction that was there (and
        the results) read `substitute[id]` wherever they read value `id`, then drop the
        instructions at `remove`. Returns the keys given to the inserted instructions."""
        inserted = {at: [self._attach(self._new_key(), instruction, self._prev[at], replacing=remove)
                         for instruction in instructions]
                    for at, instructions in insert.items()}
        new = {key for keys in inserted.values() for key in keys}
        for old_id, value in (substitute or {}).items():
            for key in sorted(self.users.get(old_id, set()) - new - {RESULT}):
                self._substitute(key, old_id, value)
            if RESULT in self.users.get(old_id, set()):
                self._set_results(tuple(value if v.id == old_id else v for v in self.results))
        removed = [value for key in remove for value in self.body[key].outputs]
        for key in remove:
            self._detach(key)
        for value in removed:
            if value.id in self.users and value.id not in self.producer:
                raise ValueError(f"value {value.id} ({value.tensor!r}) is read but no longer defined")
        for key in new:
            self._check_inputs(key)
        return inserted

    def mark(self) -> Mark:
        return Mark(len(self._log), len(self._touched), self.communication_s, self.flops)

    def rollback(self, mark: Mark) -> None:
        """Undo every edit since `mark`."""
        while len(self._log) > mark.log_length:
            record = self._log.pop()
            if record[0] == "attach":
                self._detach(record[1], log=False)
            elif record[0] == "detach":
                _, key, instruction, label, prev = record
                self._attach(key, instruction, prev, label, log=False)
            else:
                self._set_results(record[1], log=False)
        del self._touched[mark.touched_length:]
        self.communication_s, self.flops = mark.communication_s, mark.flops

    def keep(self, mark: Mark) -> set[int]:
        """Keep the edits since `mark`; returns the live instructions they touched."""
        touched = {key for key in self._touched[mark.touched_length:] if key in self.body}
        del self._log[mark.log_length:]
        del self._touched[mark.touched_length:]
        return touched

    # --- primitives (each logged, to undo, and noting what it touched) ----------------------

    def _new_key(self) -> int:
        self._next_key += 1
        return self._next_key - 1

    def _attach(self, key: int, instruction: Instruction, prev: int | None, label: Fraction | int | None = None,
                log: bool = True, replacing: set[int] = frozenset()) -> int:
        """Link `instruction` in after `prev` (None: first), with `label` or one between its neighbours'.
        It may make a value that an instruction in `replacing` (about to be removed) makes now."""
        nxt = self._first if prev is None else self._next[prev]
        if label is None:
            label = self._label_between(prev, nxt)
        self.body[key], self._label[key] = instruction, label
        self._prev[key], self._next[key] = prev, nxt
        if prev is None:
            self._first = key
        else:
            self._next[prev] = key
        if nxt is None:
            self._last = key
        else:
            self._prev[nxt] = key
        for value in instruction.outputs:
            maker = self.producer.get(value.id)
            if log and (maker is not None and maker not in replacing or value.id in self._argument_ids):
                raise ValueError(f"value id {value.id} is defined twice")
            self.producer[value.id] = key
        for value in instruction.inputs:
            self.users.setdefault(value.id, set()).add(key)
        self._account(instruction, +1)
        if log:
            self._log.append(("attach", key))
            self._touch(key)
        return key

    def _label_between(self, prev: int | None, nxt: int | None) -> Fraction | int:
        if prev is None:
            return 0 if nxt is None else self._label[nxt] - 1
        if nxt is None:
            return self._label[prev] + 1
        return Fraction(self._label[prev] + self._label[nxt], 2)

    def _detach(self, key: int, log: bool = True) -> None:
        instruction = self.body[key]
        if log:
            self._touch(key)
            self._log.append(("detach", key, instruction, self._label[key], self._prev[key]))
        prev, nxt = self._prev.pop(key), self._next.pop(key)
        if prev is None:
            self._first = nxt
        else:
            self._next[prev] = nxt
        if nxt is None:
            self._last = prev
        else:
            self._prev[nxt] = prev
        del self.body[key], self._label[key]
        for value in instruction.outputs:
            if self.producer[value.id] == key:  # else a replacement makes it now
                del self.producer[value.id]
        for value in instruction.inputs:
            readers = self.users[value.id]
            readers.discard(key)
            if not readers:
                del self.users[value.id]
        self._account(instruction, -1)

    def _substitute(self, key: int, old_id: int, value: Value) -> None:
        instruction, prev, label = self.body[key], self._prev[key], self._label[key]

        def sub(v: Value) -> Value:
            return value if v.id == old_id else v

        if isinstance(instruction, Communicate):
            changed = replace(instruction, input=sub(instruction.input))
        else:
            changed = replace(instruction, inputs=tuple(sub(v) for v in instruction.inputs))
        self._detach(key)
        self._attach(key, changed, prev, label)
        self._check_inputs(key)

    def _set_results(self, results: tuple[Value, ...], log: bool = True) -> None:
        if log:
            self._log.append(("results", self.results))
        for value in self.results:
            self.users[value.id].discard(RESULT)
            if not self.users[value.id]:
                del self.users[value.id]
        for value in results:
            self.users.setdefault(value.id, set()).add(RESULT)
        self.results = results

    def _account(self, instruction: Instruction, sign: int) -> None:
        if isinstance(instruction, Communicate):
            self.communication_s += sign * instruction.step.seconds
        else:
            self.flops += sign * local_op_flops(instruction, self.mesh)

    def _touch(self, key: int) -> None:
        """Note the instructions whose rewrite sites an edit at `key` may change: itself, the
        makers and other readers of what it reads, and the readers of what it makes."""
        instruction = self.body[key]
        self._touched.append(key)
        for value in instruction.inputs:
            if value.id in self.producer:
                self._touched.append(self.producer[value.id])
            self._touched.extend(self.users.get(value.id, ()))
        for value in instruction.outputs:
            self._touched.extend(self.users.get(value.id, ()))

    # --- invariants (what `check_program` checks, for the instructions an edit changed) -----

    def _check_inputs(self, key: int) -> None:
        instruction = self.body[key]
        for value in instruction.inputs:
            maker = self.producer.get(value.id)
            if value.id not in self._argument_ids and (maker is None or self._label[maker] >= self._label[key]):
                raise ValueError(f"instruction {key} reads value {value.id} ({value.tensor!r}) before it is defined")
        if isinstance(instruction, Communicate):
            check_step_values(instruction, f"instruction {key}")
