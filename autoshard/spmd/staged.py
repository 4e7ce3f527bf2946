"""A partitioned training step cut into pipeline parts: which instructions each virtual stage
runs as its `F`, `B` and `W` of one microbatch, which run once per step on each stage (its tail),
and which values one part hands to another. The simulator runs it and the IR prints it, so
both see the same transfers.

The program is the step on one microbatch on one stage's mesh; every stage's sub-mesh has that
shape, so a value moves between stages as each device's shard sent to the device at the same
place in the other stage (a `send`/`recv` over the stage axis).

Where an instruction runs:
- an op runs in its virtual stage (the cut), as its kind (`work_kinds`: `F`, `B`, `W`), or in
  its stage's tail when it runs once per step (`per_step_instructions`: the optimizer and the
  gradients' reductions into it);
- a collective runs where the value it reshards is made, so a part sends values as its ops
  resharded them for their readers; one resharding a stored value (no instruction makes it)
  runs where its first reader does.
A part hands a value over once to each other part reading it, straight from the part making it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from autoshard.errors import InputError
from autoshard.pipeline import StageOrders
from autoshard.pipeline.schedules import KINDS
from autoshard.planning.pipeline_cut import PipelineCut
from autoshard.planning.pipeline_stages import op_positions
from autoshard.planning.pipeline_work import work_kinds
from autoshard.spmd.per_step import per_step_instructions, varying_values
from autoshard.spmd.program import Instruction, LocalOp, SpmdProgram, Value, instruction_name

TAIL = "tail"

Slot = tuple[int, str]  # (virtual stage, kind) for F, B, W; (stage, TAIL) for the once-per-step part


@dataclass(frozen=True, slots=True)
class Handover:
    """`value`, made in slot `source`, read in slot `target` of another virtual stage."""

    value: Value
    source: Slot
    target: Slot


@dataclass(frozen=True)
class StagedProgram:
    program: SpmdProgram
    orders: StageOrders
    slots: Mapping[Slot, tuple[int, ...]]  # positions in `program.body`, in program order
    handovers: tuple[Handover, ...]  # per microbatch, each value once to each part reading it
    accumulated: tuple[tuple[Value, Slot], ...]  # per-microbatch values a tail reads, and the slot making them
    summed: frozenset[int] = frozenset()  # those of them that vary by microbatch (`varying_values`): the rest are kept

    def work(self, virtual: int, kind: str) -> tuple[int, ...]:
        return self.slots.get((virtual, kind), ())

    def tail(self, stage: int) -> tuple[int, ...]:
        return self.slots.get((stage, TAIL), ())

    def stage_of(self, slot: Slot) -> int:
        return slot[0] if slot[1] == TAIL else self.orders.placement(slot[0])[0]

    def crosses(self, handover: Handover) -> bool:
        """Whether the handover moves between stages (virtual stages on one stage hand over in place)."""
        return self.stage_of(handover.source) != self.stage_of(handover.target)


def stage_program(program: SpmdProgram, cut: PipelineCut) -> StagedProgram:
    """`program` (the step on one microbatch) cut as `cut` places its ops; InputError naming the
    instruction when a part reads a value the schedule does not make before it."""
    graph, orders = program.graph, cut.orders
    once = per_step_instructions(program)
    kinds = work_kinds(graph, op_positions(graph))
    made_by = {value.id: position for position, item in enumerate(program.body) for value in item.outputs}
    slot_at: dict[int, Slot] = {}
    for position, item in enumerate(program.body):
        if isinstance(item, LocalOp):
            slot_at[position] = (cut.part_of[item.op.name], kinds[item.op.name])
        elif made_by.get(item.input.id) in slot_at:  # not a resharding of a stored value's resharding
            slot_at[position] = slot_at[made_by[item.input.id]]
    # a stored value's resharding (and a resharding of that): where its first reader runs
    for position in reversed(range(len(program.body))):
        if position not in slot_at:
            readers = [p for p, item in enumerate(program.body) if any(v.id == program.body[position].output.id
                                                                          for v in item.inputs)]
            slot_at[position] = slot_at[readers[0]] if readers else (cut.part_of[graph.order[0].name], "F")
    for position in once:  # the tail of the stage the instruction's part is on
        slot_at[position] = (orders.placement(slot_at[position][0])[0], TAIL)
    slots: dict[Slot, list[int]] = {}
    for position in range(len(program.body)):
        slots.setdefault(slot_at[position], []).append(position)
    handovers: dict[tuple[int, int], Handover] = {}  # (value, reading part) -> from its earliest reading slot
    accumulated: dict[int, tuple[Value, Slot]] = {}
    for position, item in enumerate(program.body):
        target = slot_at[position]
        for value in item.inputs:
            if value.id not in made_by or slot_at[made_by[value.id]] == target:
                continue
            source = slot_at[made_by[value.id]]
            if target[1] == TAIL and source[1] != TAIL:
                accumulated.setdefault(value.id, (value, source))
                continue
            _check_order(value, source, target, item)
            known = handovers.get((value.id, target[0]))
            if source[0] != target[0] and (known is None or KINDS.index(target[1]) < KINDS.index(known.target[1])):
                handovers[value.id, target[0]] = Handover(value, source, target)
    return StagedProgram(program, orders, {slot: tuple(positions) for slot, positions in slots.items()},
                         tuple(handovers.values()), tuple(accumulated.values()),
                         frozenset(accumulated) & frozenset(varying_values(program)))


def _check_order(value: Value, source: Slot, target: Slot, item: Instruction) -> None:
    """Refuse what the schedules do not order: within a part `F` runs before `B` before `W`; `F`
    of virtual stage v after the `F`s of those before it; `B` and `W` after every `F` and after
    the `B`s of those after it; a tail hands nothing to another part."""
    (u, made), (v, read) = source, target
    if made == TAIL or read == TAIL:
        ordered = False
    elif u == v:
        ordered = KINDS.index(made) < KINDS.index(read)
    else:
        ordered = (made == "F" and (read != "F" or u < v)) or (made == "B" and read != "F" and u > v)
    if not ordered:
        raise InputError(f"{instruction_name(item)} on {_named(target)} reads {value.tensor!r} (value %{value.id}) "
                         f"made on {_named(source)}, which a pipeline schedule does not run before it", "pipeline")


def _named(slot: Slot) -> str:
    return f"stage {slot[0]}'s once-per-step part" if slot[1] == TAIL else f"virtual stage {slot[0]} ({slot[1]})"
