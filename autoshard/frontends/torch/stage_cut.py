"""An imported program cut at a pipelined plan's boundaries: the steps each virtual stage runs,
and the values that cross from one virtual stage to the next.

The plan names its stages' ops as the importer names them (a graph op is its FX node's name, or
`<node>.<role>` for an aten op lowered to several), and a training plan's forward ops keep
their names, so each step of the forward program finds its stage by name. A node kept opaque
has no op in the plan: it runs on the latest stage of the values it reads (it is replicated
bookkeeping, computed where its inputs are).

torch.distributed.pipelining passes a stage's outputs, in order, as the next stage's arguments,
so a value read two stages later is passed through the stage between; the first stage takes
the program's arguments, the last returns the program's outputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from autoshard.errors import InputError, Problem
from autoshard.frontends.torch.importer import ImportedProgram
from autoshard.frontends.torch.lowering import Step


@dataclass(frozen=True)
class StagePart:
    """One virtual stage's part of the program: its steps in program order, the values it takes
    and returns (graph tensor names, in the order torch passes them), and the parameters and
    buffers it reads."""

    virtual_stage: int
    steps: tuple[Step, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    held: frozenset[str]


def cut_program(imported: ImportedProgram, planned: Mapping[str, int], count: int) -> list[StagePart]:
    """The program's `count` parts, by virtual stage, from each op's virtual stage (`planned`, by
    op name); an InputError naming the ops it does not place (a plan made for another program)
    or places before a value they read."""
    produced_on: dict[str, int] = {}  # value -> virtual stage of the step producing it
    stage_of: list[int] = []
    missing: list[str] = []
    early: list[Problem] = []
    for step in imported.steps:
        read = [produced_on[t] for t in step.inputs if t in produced_on]
        if step.opaque:
            stage = max(read, default=0)
        elif step.outputs[0] not in planned:
            missing.append(step.outputs[0])
            stage = max(read, default=0)
        else:
            stage = planned[step.outputs[0]]
            late = [t for t in step.inputs if produced_on.get(t, 0) > stage]
            early += [Problem(f"/pipeline/ops/{step.outputs[0]}", f"op {step.outputs[0]!r} runs on virtual stage "
                              f"{stage} but reads {t!r} from virtual stage {produced_on[t]}") for t in late]
        stage_of.append(stage)
        produced_on.update((t, stage) for t in step.outputs if t)
    if missing:
        raise InputError(f"the plan's stages do not place ops {missing[:5]}{' ...' if len(missing) > 5 else ''} of "
                         "the program: was it made for another program, or exported with other example inputs?",
                         "/pipeline/stages")
    if early:
        raise InputError(early)
    return _parts(imported, stage_of, count)


def _parts(imported: ImportedProgram, stage_of: list[int], count: int) -> list[StagePart]:
    local = set(imported.parameters) | set(imported.scalars)  # each stage holds its own
    steps = imported.steps
    # boundary v joins virtual stages v and v + 1: what was made up to v and is read after it
    crossing: list[tuple[str, ...]] = []
    for boundary in range(count - 1):
        made = list(imported.user_inputs) + [t for step, stage in zip(steps, stage_of) if stage <= boundary
                                             for t in step.outputs if t]
        later = {t for step, stage in zip(steps, stage_of) if stage > boundary for t in step.inputs}
        later |= set(imported.outputs)
        crossing.append(tuple(t for t in dict.fromkeys(made) if t in later and t not in local))
    parts = []
    for v in range(count):
        mine = tuple(step for step, stage in zip(steps, stage_of) if stage == v)
        inputs = tuple(imported.user_inputs) if v == 0 else crossing[v - 1]
        outputs = tuple(imported.outputs) if v == count - 1 else crossing[v]
        held = frozenset(t for step in mine for t in step.inputs if t in imported.parameters)
        parts.append(StagePart(v, mine, inputs, outputs, held))
    return parts
