"""Run a pipelined step as its schedule runs it: every stage works through its own order of `F`,
`B` and `W` items (`StageOrders`), one microbatch through one chunk each, on its own devices;
the values one stage hands another are sent and received between them; the gradients are
accumulated across microbatches and each stage's once-per-step part (gradient reduction and
optimizer) runs after its last item.

Each stage keeps its own values: its stored arguments laid out once, and per microbatch in flight
its slice of the batch and what its items make or receive, each dropped after the last of the
stage's items to read it. The activations a stage holds are counted as the schedule holds them:
a chunk's saved values from its `F` until the `W`s of every chunk of the stage reading them.
Values are checked as in `simulate_microbatched`: each microbatch's against the reference on its
slice of the batch, the accumulated gradients and everything after them against the reference on
the whole batch; the references are computed as the checks read them and hold only the values
still to be read (`LiveReference`), so the simulation's memory follows what is live, not every
value the step makes.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any, Mapping

import numpy as np

from autoshard.dtypes import DTYPES
from autoshard.errors import InputError
from autoshard.graph.evaluate import random_inputs
from autoshard.graph.model import Graph
from autoshard.graph.summary import size
from autoshard.pipeline import StageOrders, WorkItem, inflight_peaks
from autoshard.pipeline.schedules import KINDS
from autoshard.planning.microbatches import ACCUMULATION_DTYPE, Microbatching
from autoshard.sim.collectives import Shards
from autoshard.sim.live_reference import LiveReference, evaluation_peak_bytes, expected_reads
from autoshard.sim.local_op import Placed
from autoshard.sim.microbatch import batch_slice
from autoshard.sim.precision import widen_dtype, widen_graph, widen_inputs
from autoshard.sim.program import DEFAULT_MAX_BYTES, Diverged, Execution, results_problem, values_bytes
from autoshard.sim.verdict import Divergence, Verdict
from autoshard.spmd.program import SpmdProgram
from autoshard.spmd.staged import TAIL, StagedProgram


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
    needed = pipelined_bytes(program, orders, microbatching.whole, widen)
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


def pipelined_bytes(program: SpmdProgram, orders: StageOrders, whole: Graph, widen: bool = True) -> int:
    """Memory a pipelined simulation of `program` (the step of `whole` on one microbatch) holds at
    most, about: the stored values, and as much again for the summed gradients and the new state
    the once-per-step part makes; of the values one microbatch makes on every device, each
    stage's share for each (microbatch, chunk) pair it holds at its in-flight peak, and one
    item's more; the step's inputs; the reference's live values for as many microbatches as a
    stage holds in flight and one, and then the whole batch's (`evaluation_peak_bytes`)."""
    peaks = inflight_peaks(orders)
    made = values_bytes(program.mesh, (v for item in program.body for v in item.outputs), widen)
    inputs = sum(math.prod(t.shape) * np.dtype(DTYPES[widen_dtype(t.dtype) if widen else t.dtype].numpy).itemsize
                 for t in whole.tensors.values() if t.role != "intermediate")
    return int(2 * values_bytes(program.mesh, program.arguments, widen) + made * (sum(peaks) / orders.virtual_stages + 1)
               + inputs + (max(peaks) + 1) * evaluation_peak_bytes(program.graph, widen)
               + evaluation_peak_bytes(whole, widen))


class _Run:
    """A pipelined step in progress: each stage's values of the microbatches in flight, its
    stored arguments, the gradient sums, the references of the microbatches in flight, and what
    it ran, held and sent so far.

    A stage's value of a microbatch is dropped after the last of that stage's items to read it
    (once sent on and summed), and a microbatch's values and reference once its last item has
    run, so memory follows the values live at each point of the schedule, not every value ever
    made. The reference values are computed as the checks ask for them (`LiveReference`)."""

    def __init__(self, staged: StagedProgram, microbatching: Microbatching, inputs: dict[str, np.ndarray], widen: bool):
        self.staged, self.orders, self.body = staged, staged.orders, staged.program.body
        self.execution = Execution(staged.program, widen)
        self.microbatching, self.inputs, self.widen = microbatching, inputs, widen
        self.micro_graph = widen_graph(microbatching.graph) if widen else microbatching.graph
        whole, stages = microbatching.whole, self.orders.stages
        self.batched = [v for v in staged.program.arguments if whole.tensors[v.tensor].batch_dim is not None]
        work = [slot for slot in staged.slots if slot[1] != TAIL]
        self.reads = {slot: {v.id for p in staged.slots[slot] for v in self.body[p].inputs} for slot in work}
        self.made = {slot: {v.id for p in staged.slots[slot] for v in self.body[p].outputs} for slot in work}
        self.reads_on = [Counter(i for slot in work if staged.stage_of(slot) == stage for i in self.reads[slot])
                         for stage in range(stages)]
        tail_reads = [{v.id for p in staged.tail(stage) for v in self.body[p].inputs} for stage in range(stages)]
        self.stored = [self.execution.arguments(inputs, [v for v in staged.program.arguments if v not in self.batched
                                                         and (v.id in self.reads_on[stage] or v.id in tail_reads[stage])])
                       for stage in range(stages)]
        self.micro_reads = expected_reads(self.micro_graph, (v.tensor for slot in work for p in staged.slots[slot]
                                                             for v in self.body[p].outputs))
        self.env: dict[tuple[int, int], dict[int, Placed]] = {}
        self.unread: dict[tuple[int, int], Counter[int]] = {}  # per (stage, microbatch): its items' reads to come
        self.references: dict[int, LiveReference] = {}
        self.left = Counter(item.microbatch for order in self.orders.orders for item in order)
        self.left_on = Counter((s, item.microbatch) for s, order in enumerate(self.orders.orders) for item in order)
        self.sums: dict[int, Shards] = {}
        self.ran: list[list[WorkItem]] = [[] for _ in range(stages)]
        self.peaks = [0] * stages
        self.holding: list[set[tuple[int, int]]] = [set() for _ in range(stages)]  # (virtual stage, microbatch)
        self.transfers: list[Transfer] = []
        self.done: set[tuple[int, str, int]] = set()  # (virtual stage, kind, microbatch)
        self.tail_envs: list[dict[int, Placed]] = []
        self.result_ids = {v.id for v in staged.program.results}
        self.held_until = self._held_until()

    def _held_until(self) -> list[set[int] | None]:
        """Per virtual stage, None when its `F` saves no activation (a value a backward reads),
        else the virtual stages on its stage that touch one: once their `W`s have all run for a
        microbatch, the stage no longer holds that microbatch's activations of it."""
        staged, body = self.staged, self.body
        backward = {v.id for slot, positions in staged.slots.items() if slot[1] in ("B", "W")
                    for p in positions for v in body[p].inputs}
        users: dict[int, set[int]] = {}
        for virtual in range(self.orders.virtual_stages):
            for p in (p for kind in KINDS for p in staged.work(virtual, kind)):
                for v in (*body[p].inputs, *body[p].outputs):
                    users.setdefault(v.id, set()).add(virtual)
        until: list[set[int] | None] = []
        for virtual in range(self.orders.virtual_stages):
            stage = self.orders.placement(virtual)[0]
            saved = {v.id for p in staged.work(virtual, "F") for v in body[p].outputs} & backward
            until.append({u for i in saved for u in users[i] if self.orders.placement(u)[0] == stage}
                         if saved else None)
        return until

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

    def _env(self, stage: int, m: int) -> dict[int, Placed]:
        """Stage `stage`'s values of microbatch `m`: its stored arguments and its slice of the
        batch, laid out when first needed."""
        if (stage, m) not in self.env:
            read = self.reads_on[stage]
            batched = [v for v in self.batched if v.id in read]
            sliced = {v.tensor: batch_slice(self.microbatching.whole, v.tensor, self.inputs[v.tensor], m,
                                            self.orders.microbatches) for v in batched}
            self.env[stage, m] = {**self.stored[stage], **self.execution.arguments(sliced, batched)}
            self.unread[stage, m] = Counter(read)
        return self.env[stage, m]

    def _reference(self, m: int) -> LiveReference:
        """The unsharded graph's values on microbatch `m`'s slice of the batch, as its checks read them."""
        if m not in self.references:
            count, whole = self.orders.microbatches, self.microbatching.whole
            sliced = {name: batch_slice(whole, name, array, m, count) for name, array in self.inputs.items()}
            self.references[m] = LiveReference(self.micro_graph, sliced, self.micro_reads)
        return self.references[m]

    def _item(self, stage: int, item: WorkItem) -> None:
        virtual, m = self.orders.virtual_stage(stage, item.chunk), item.microbatch
        slot, env = (virtual, item.kind), self._env(stage, m)
        try:
            self.execution.run([self.body[p] for p in self.staged.work(*slot)], env, self._reference(m))
        except Diverged as failure:
            d = failure.divergence
            raise Diverged(replace(d, message=f"{d.message} (stage {stage}, {item!r})")) from None
        self.done.add((*slot, m))
        self.ran[stage].append(item)
        for handover in self.staged.handovers:
            if handover.source == slot:
                target = self.staged.stage_of(handover.target)
                self._env(target, m)[handover.value.id] = env[handover.value.id]
                if target != stage:
                    self.transfers.append(Transfer(handover.value.tensor, handover.value.id, m, stage, target))
        for value, source in self.staged.accumulated:
            if source == slot and value.id in self.staged.summed:
                self._accumulate(value.id, env[value.id].shards)
            elif source == slot:  # the same in every microbatch
                self.sums[value.id] = env[value.id].shards
        self._release(stage, slot, m)
        self._count_held(stage, item, virtual, m)

    def _accumulate(self, value_id: int, shards: Shards) -> None:
        """Add one microbatch's gradient to its sum, kept at least as wide as the accumulation dtype."""
        wide = DTYPES[ACCUMULATION_DTYPE].numpy
        if value_id not in self.sums:
            self.sums[value_id] = {d: a.astype(np.promote_types(a.dtype, wide)) for d, a in shards.items()}
        else:
            self.sums[value_id] = {d: self.sums[value_id][d] + a for d, a in shards.items()}

    def _release(self, stage: int, slot: tuple[int, str], m: int) -> None:
        """Drop what `slot` read or made on `stage` for microbatch `m` that no item of the stage
        still to run for `m` reads (the last microbatch's results stay, for the verdict); drop
        the stage's values of `m` after its last item for `m`, and `m`'s reference after the
        last item of any stage for `m`."""
        env, unread = self.env[stage, m], self.unread[stage, m]
        last = m == self.orders.microbatches - 1
        read, made = self.reads.get(slot, set()), self.made.get(slot, set())  # a slot may run nothing
        unread.subtract(read)
        for value_id in read | made:
            if unread[value_id] <= 0 and not (last and value_id in self.result_ids):
                env.pop(value_id, None)
        self.left_on[stage, m] -= 1
        if not self.left_on[stage, m]:
            del self.unread[stage, m]
            if not last:
                del self.env[stage, m]
        self.left[m] -= 1
        if not self.left[m]:
            del self.references[m]

    def _count_held(self, stage: int, item: WorkItem, virtual: int, m: int) -> None:
        """The (microbatch, chunk) pairs whose activations `stage` holds, as the schedule counts
        them: from a chunk's `F` until the `W`s of every chunk reading what it saved."""
        holding = self.holding[stage]
        if item.kind == "F" and self.held_until[virtual] is not None:
            holding.add((virtual, m))
        elif item.kind == "W":
            holding -= {(v, n) for v, n in holding
                        if n == m and all((u, "W", m) in self.done for u in self.held_until[v])}
        self.peaks[stage] = max(self.peaks[stage], len(holding))

    def tails(self) -> None:
        """Each stage's once-per-step part, on its stored values and the gradients summed over
        the microbatches (sent on when another stage made them), checked against the whole
        batch's reference."""
        graph = widen_graph(self.microbatching.whole) if self.widen else self.microbatching.whole
        stages = range(self.orders.stages)
        read = [{v.id for p in self.staged.tail(stage) for v in self.body[p].inputs} for stage in stages]
        checked = [value.tensor for stage in stages for value, _ in self.staged.accumulated if value.id in read[stage]]
        checked += [v.tensor for stage in stages for p in self.staged.tail(stage) for v in self.body[p].outputs]
        reference = LiveReference(graph, self.inputs, expected_reads(graph, checked))
        for stage in stages:
            env = dict(self.stored[stage])
            for value, source in self.staged.accumulated:
                if value.id in read[stage]:
                    maker = self.staged.stage_of(source)
                    if maker != stage:
                        self.transfers.append(Transfer(value.tensor, value.id, -1, maker, stage))
                    self.execution.record(f"accumulated over {self.orders.microbatches} microbatches", value,
                                          self.sums[value.id], env, reference)
            self.execution.run([self.body[p] for p in self.staged.tail(stage)], env, reference)
            self.tail_envs.append({i: placed for i, placed in env.items() if i in self.result_ids})  # for the verdict

    def results(self) -> dict[int, Placed]:
        """Every stage's values as the last microbatch and the tails left them."""
        merged: dict[int, Placed] = {}
        for stage in range(self.orders.stages):
            merged.update(self.env.get((stage, self.orders.microbatches - 1), {}))
        for env in self.tail_envs:
            merged.update(env)
        return merged

    def outcome(self, divergence: Divergence | None) -> PipelinedRun:
        return PipelinedRun(self.execution.verdict(divergence), tuple(map(tuple, self.ran)), tuple(self.peaks),
                            tuple(self.transfers))
