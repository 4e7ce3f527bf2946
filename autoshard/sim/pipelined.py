"""Run a pipelined step as its schedule runs it: every stage works through its own order of `F`,
`B` and `W` items (`StageOrders`), one microbatch through one chunk each, on its own devices;
the values one stage hands another are sent and received between them; the gradients are
accumulated across microbatches and each stage's once-per-step part (gradient reduction and
optimizer) runs after its last item.

Each stage keeps its own values: its stored arguments laid out once, and per microbatch the
batch's slice and what its items make or receive. An item runs when every value it receives has
been sent (the stage waits otherwise, as it would for a `recv`); after a chunk's `W` the
microbatch's values of that chunk are dropped, so the activations a stage holds are counted
from what it stores, not from the schedule. Values are checked as in `simulate_microbatched`:
each microbatch's against the reference on its slice of the batch, the accumulated gradients
and everything after them against the reference on the whole batch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

import numpy as np

from autoshard.dtypes import DTYPES
from autoshard.errors import InputError
from autoshard.graph.evaluate import evaluate_graph, random_inputs
from autoshard.graph.summary import size
from autoshard.pipeline import StageOrders, WorkItem, inflight_peaks
from autoshard.pipeline.schedules import KINDS
from autoshard.planning.microbatches import ACCUMULATION_DTYPE, Microbatching
from autoshard.sim.collectives import Shards
from autoshard.sim.local_op import Placed
from autoshard.sim.microbatch import batch_slice
from autoshard.sim.precision import widen_graph, widen_inputs
from autoshard.sim.program import (DEFAULT_MAX_BYTES, Diverged, Execution, reference_bytes, results_problem,
                                   values_bytes)
from autoshard.sim.verdict import Divergence, Verdict
from autoshard.spmd.program import SpmdProgram
from autoshard.spmd.staged import StagedProgram


@dataclass(frozen=True, slots=True)
class Transfer:
    """One value of one microbatch sent from a stage's devices to another's."""

    tensor: str
    value: int
    microbatch: int  # -1: a gradient summed over the step, sent to the stage whose optimizer reads it
    source: int
    target: int


@dataclass(frozen=True)
class PipelinedRun:
    verdict: Verdict
    ran: tuple[tuple[WorkItem, ...], ...]  # per stage, its items in the order it ran them
    inflight_peaks: tuple[int, ...]  # per stage, the most (microbatch, chunk) pairs whose activations it held at once
    transfers: tuple[Transfer, ...]  # in the order sent

    def to_json(self) -> dict[str, Any]:
        """What the run shows of the schedule: each stage's items as run (`F0`, `B1/1` for chunk 1),
        in-flight peaks and the number of transfers between stages."""
        return {"ran": [[repr(item) for item in order] for order in self.ran],
                "inflight_peaks": list(self.inflight_peaks), "transfers": len(self.transfers)}


def simulate_pipelined(staged: StagedProgram, microbatching: Microbatching,
                       inputs: Mapping[str, np.ndarray] | None = None, *, seed: int = 0,
                       max_bytes: float = DEFAULT_MAX_BYTES, widen: bool = True) -> PipelinedRun:
    """Run `staged` (of `microbatching.graph`) for the step on the whole batch; `inputs` are the
    whole step's (default: its random inputs of `seed`)."""
    program, orders = staged.program, staged.orders
    needed = pipelined_bytes(program, orders, widen)
    if needed > max_bytes:
        raise InputError(f"simulating {orders.microbatches} microbatches of graph {microbatching.whole.name!r} "
                         f"pipelined over {orders.stages} stages needs about {size(needed)}, over the limit of "
                         f"{size(max_bytes)}", "max_bytes")
    inputs = dict(inputs if inputs is not None else random_inputs(microbatching.whole, seed))
    run = _Run(staged, microbatching, widen_inputs(inputs) if widen else inputs, widen)
    try:
        run.items()
        run.tails()
    except Diverged as failure:
        return run.outcome(failure.divergence)
    return run.outcome(results_problem(program, run.results()))


def pipelined_bytes(program: SpmdProgram, orders: StageOrders, widen: bool = True) -> int:
    """Memory a pipelined simulation holds at most: the stored values once; the values one
    microbatch makes, for as many microbatches as the most any stage holds in flight and the one
    running (the stages hold disjoint parts); the references on the whole batch and on every
    microbatch (together about the whole batch's again)."""
    made = values_bytes(program.mesh, (v for item in program.body for v in item.outputs), widen)
    return (values_bytes(program.mesh, program.arguments, widen) + made * (max(inflight_peaks(orders)) + 1)
            + 2 * reference_bytes(program, widen))


class _Run:
    """A pipelined step in progress: each stage's values per microbatch, its stored arguments,
    the gradient sums, and what it ran, held and sent so far."""

    def __init__(self, staged: StagedProgram, microbatching: Microbatching, inputs: dict[str, np.ndarray], widen: bool):
        self.staged, self.orders, self.body = staged, staged.orders, staged.program.body
        self.execution = Execution(staged.program, widen)
        whole, count = microbatching.whole, self.orders.microbatches
        micro_graph = widen_graph(microbatching.graph) if widen else microbatching.graph
        sliced = [{name: batch_slice(whole, name, array, m, count) for name, array in inputs.items()}
                  for m in range(count)]
        self.references = [evaluate_graph(micro_graph, inputs_m) for inputs_m in sliced]
        self.whole_reference = evaluate_graph(widen_graph(whole) if widen else whole, inputs)
        batched = [v for v in staged.program.arguments if whole.tensors[v.tensor].batch_dim is not None]
        self.stored = [self.execution.arguments(inputs, [v for v in staged.program.arguments if v not in batched
                                                         and v.id in self._read_on(stage)])
                       for stage in range(self.orders.stages)]
        self.env = {(s, m): {**self.stored[s], **self.execution.arguments(sliced[m], batched)}
                    for s in range(self.orders.stages) for m in range(count)}
        self.sums: dict[int, Shards] = {}
        self.ran: list[list[WorkItem]] = [[] for _ in range(self.orders.stages)]
        self.peaks = [0] * self.orders.stages
        self.transfers: list[Transfer] = []
        self.done: set[tuple[int, str, int]] = set()  # (virtual stage, kind, microbatch)
        self.tail_envs: list[dict[int, Placed]] = []
        backward = {v.id for slot, positions in staged.slots.items() if slot[1] in ("B", "W")
                    for p in positions for v in self.body[p].inputs}
        self.touched = [{v.id for kind in KINDS for p in staged.work(virtual, kind)
                         for v in (*self.body[p].inputs, *self.body[p].outputs)}
                        for virtual in range(self.orders.virtual_stages)]
        self.users: dict[int, set[int]] = {}
        for virtual, ids in enumerate(self.touched):
            for value_id in ids:
                self.users.setdefault(value_id, set()).add(virtual)
        self.result_ids = {v.id for v in staged.program.results}
        self.saved = [{v.id for p in staged.work(virtual, "F") for v in self.body[p].outputs} & backward
                      for virtual in range(self.orders.virtual_stages)]

    def _read_on(self, stage: int) -> set[int]:
        """Ids of the values the instructions of `stage` read."""
        return {v.id for slot, positions in self.staged.slots.items() if self.staged.stage_of(slot) == stage
                for p in positions for v in self.body[p].inputs}

    def items(self) -> None:
        """Every stage's items in its order, a stage waiting while an item's received values are unsent."""
        left = [list(order) for order in self.orders.orders]
        while any(left):
            ready = [s for s, order in enumerate(left) if order and self._ready(s, order[0])]
            if not ready:
                stuck = ", ".join(f"stage {s} at {order[0]!r}" for s, order in enumerate(left) if order)
                raise Diverged(Divergence("pipeline", "", None, None, None, None,
                                          f"every stage waits for a value no stage has sent: {stuck}"))
            for stage in ready:
                self._item(stage, left[stage].pop(0))

    def _ready(self, stage: int, item: WorkItem) -> bool:
        slot = (self.orders.virtual_stage(stage, item.chunk), item.kind)
        return all((*h.source, item.microbatch) in self.done for h in self.staged.handovers if h.target == slot)

    def _item(self, stage: int, item: WorkItem) -> None:
        virtual, m = self.orders.virtual_stage(stage, item.chunk), item.microbatch
        slot, env = (virtual, item.kind), self.env[stage, m]
        try:
            self.execution.run([self.body[p] for p in self.staged.work(*slot)], env, self.references[m])
        except Diverged as failure:
            d = failure.divergence
            raise Diverged(replace(d, message=f"{d.message} (stage {stage}, {item!r})")) from None
        self.done.add((*slot, m))
        self.ran[stage].append(item)
        for handover in self.staged.handovers:
            if handover.source == slot:
                target = self.staged.stage_of(handover.target)
                self.env[target, m][handover.value.id] = env[handover.value.id]
                if target != stage:
                    self.transfers.append(Transfer(handover.value.tensor, handover.value.id, m, stage, target))
        for value, source in self.staged.accumulated:
            if source == slot and value.id in self.staged.summed:
                self._accumulate(value.id, env[value.id].shards)
            elif source == slot:  # the same in every microbatch
                self.sums[value.id] = env[value.id].shards
        if item.kind == "W":
            self._release(stage, virtual, m)
        self.peaks[stage] = max(self.peaks[stage], self._held(stage))

    def _accumulate(self, value_id: int, shards: Shards) -> None:
        """Add one microbatch's gradient to its sum, kept at least as wide as the accumulation dtype."""
        wide = DTYPES[ACCUMULATION_DTYPE].numpy
        if value_id not in self.sums:
            self.sums[value_id] = {d: a.astype(np.promote_types(a.dtype, wide)) for d, a in shards.items()}
        else:
            self.sums[value_id] = {d: self.sums[value_id][d] + a for d, a in shards.items()}

    def _release(self, stage: int, virtual: int, m: int) -> None:
        """Drop the values of microbatch `m` that `virtual` made or read and that no part on
        `stage` still to run its `W` for `m` uses (its activations, once its `W` has read them),
        keeping the program's results."""
        env = self.env[stage, m]
        for value_id in self.touched[virtual] - self.result_ids:
            if all((u, "W", m) in self.done for u in self.users[value_id] if self.orders.placement(u)[0] == stage):
                env.pop(value_id, None)

    def _held(self, stage: int) -> int:
        """The (microbatch, chunk) pairs whose saved activations (values a chunk's forward made
        that a backward reads) `stage` still holds."""
        count = 0
        for chunk in range(self.orders.chunks):
            saved = self.saved[self.orders.virtual_stage(stage, chunk)]
            count += sum(any(i in self.env[stage, m] for i in saved) for m in range(self.orders.microbatches))
        return count

    def tails(self) -> None:
        """Each stage's once-per-step part, on its stored values and the gradients summed over
        the microbatches (sent on when another stage made them)."""
        for stage in range(self.orders.stages):
            env = dict(self.stored[stage])
            read = {v.id for p in self.staged.tail(stage) for v in self.body[p].inputs}
            for value, source in self.staged.accumulated:
                if value.id in read:
                    maker = self.staged.stage_of(source)
                    if maker != stage:
                        self.transfers.append(Transfer(value.tensor, value.id, -1, maker, stage))
                    self.execution.record(f"accumulated over {self.orders.microbatches} microbatches", value,
                                          self.sums[value.id], env, self.whole_reference)
            self.execution.run([self.body[p] for p in self.staged.tail(stage)], env, self.whole_reference)
            self.tail_envs.append(env)

    def results(self) -> dict[int, Placed]:
        """Every stage's values as the last microbatch and the tails left them."""
        merged: dict[int, Placed] = {}
        for stage in range(self.orders.stages):
            merged.update(self.env[stage, self.orders.microbatches - 1])
        for env in self.tail_envs:
            merged.update(env)
        return merged

    def outcome(self, divergence: Divergence | None) -> PipelinedRun:
        return PipelinedRun(self.execution.verdict(divergence), tuple(map(tuple, self.ran)), tuple(self.peaks),
                            tuple(self.transfers))
