"""What a finished plan is handed over as: the plan document, the IR asked for, the collective
optimisations applied and the simulator's verdict, from one partitioned program.

The CLI writes these as files and the service stores them; both take them from here, so the IR
a user reads is the program the simulator ran.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping, Sequence

from autoshard.delivery.document import plan_document
from autoshard.errors import InputError, Problem
from autoshard.mlir import ARGUMENT_CONVENTIONS, DIALECTS, emit_annotated, emit_partitioned, emit_pipelined
from autoshard.phases import PhaseTimes
from autoshard.planning.costs import Hardware
from autoshard.planning.make_plan import PlanResult
from autoshard.planning.pipeline_cut import PipelineCut
from autoshard.planning.plan import Plan
from autoshard.resharding import Price
from autoshard.sim.verify import ALWAYS_LIMIT_BYTES, VERIFY_POLICIES, policy_problem, verify_program
from autoshard.spmd.collective_opt import Change, optimize
from autoshard.spmd.program import SpmdProgram, partition
from autoshard.spmd.staged import stage_program

STAGES = ("annotated", "partitioned")


@dataclass(frozen=True)
class Deliverables:
    document: dict[str, Any]  # autoshard.plan/v1, with `collective_optimizations` and `verification`
    ir: dict[str, str]  # stage -> module text, for the stages asked for


def ir_request_problems(stages: Sequence[str], dialect: str, arguments: str,
                        where: Mapping[str, str] = MappingProxyType({})) -> list[Problem]:
    """Every unknown stage, dialect or argument convention; `where` renames the parameters
    (`emit`, `dialect`, `arguments`) to what the caller's user set, e.g. a flag."""
    problems = [Problem(where.get("emit", "emit"), f"unknown IR stage {s!r}; expected {' or '.join(STAGES)}")
                for s in stages if s not in STAGES]
    if dialect not in DIALECTS:
        problems.append(Problem(where.get("dialect", "dialect"), f"expected {' or '.join(DIALECTS)}, got {dialect!r}"))
    if arguments not in ARGUMENT_CONVENTIONS:
        problems.append(Problem(where.get("arguments", "arguments"),
                                f"expected {' or '.join(ARGUMENT_CONVENTIONS)}, got {arguments!r}"))
    return problems


def partitioned_program(plan: Plan, price: Price, optimize_collectives: bool = True,
                        phases: PhaseTimes | None = None) -> tuple[SpmdProgram, list[Change]]:
    """The plan's SPMD program with the collectives `price` chooses (the hardware's, as the plan's
    reshardings were priced), then (unless switched off) the collective optimisations that lower
    communication time; returns the program and the optimisations applied. `phases` times the two."""
    phases = PhaseTimes() if phases is None else phases
    with phases.phase("partition"):
        program = partition(plan, price)
    if not optimize_collectives:
        return program, []
    with phases.phase("collective_optimizations"):
        return optimize(program)


def partitioned_ir(program: SpmdProgram, dialect: str, arguments: str, pipeline: PipelineCut | None = None) -> str:
    """The partitioned IR of `program`: with `pipeline`, one function per virtual stage and the
    transfers between stages."""
    if pipeline is None:
        return emit_partitioned(program, dialect=dialect, arguments=arguments)
    return emit_pipelined(stage_program(program, pipeline), dialect=dialect, arguments=arguments)


def placement_options(nodes: int | None, slice_shape: Sequence[int] | None = None,
                      mapping: Mapping[str, Sequence[str]] | None = None) -> dict[str, Any]:
    """A plan document's `topology_options`: where the mesh was placed, the keys given."""
    return {key: value for key, value in
            (("nodes", nodes), ("slice", list(slice_shape) if slice_shape else None),
             ("mapping", {a: list(d) for a, d in mapping.items()} if mapping else None))
            if value is not None}


def deliver(result: PlanResult, hardware: Hardware, topology: str, *, emit: Sequence[str] = (),
            dialect: str = "mesh", arguments: str = "local", verify: str = "auto",
            optimize_collectives: bool = True, seed: int = 0, verify_max_bytes: float = ALWAYS_LIMIT_BYTES,
            nodes: int | None = None, slice_shape: Sequence[int] | None = None,
            mapping: Mapping[str, Sequence[str]] | None = None, pipeline: PipelineCut | None = None) -> Deliverables:
    """`nodes`, `slice_shape` and `mapping` (mesh axis -> physical dims) are where the mesh was
    placed on the topology (None: the default placement); the document records them so `emit`
    and `simulate` price reshardings alike. With `pipeline` the plan is verified and emitted as
    pipelined (its stages in the schedule's order, one IR function per virtual stage)."""
    problems = ir_request_problems(emit, dialect, arguments)
    if verify not in VERIFY_POLICIES:
        problems.append(policy_problem(verify, "verify"))
    if problems:
        raise InputError(problems)
    document = plan_document(result, topology)
    document["topology_options"] = placement_options(nodes, slice_shape, mapping)
    phases = result.phases
    program, changes = partitioned_program(result.plan, hardware.collective_seconds, optimize_collectives, phases)
    if optimize_collectives:
        before = changes[0].seconds_before if changes else program.communication_seconds()
        document["collective_optimizations"] = {
            "communication_s_before": before, "communication_s_after": program.communication_seconds(),
            "changes": [{"rewrite": c.rewrite, "detail": c.detail, "seconds_before": c.seconds_before,
                         "seconds_after": c.seconds_after} for c in changes]}
    with phases.phase("verification"):
        document["verification"] = verify_program(program, verify, seed, verify_max_bytes, result.microbatching,
                                                  pipeline)
    ir = {}
    with phases.phase("ir_emission"):
        if "annotated" in emit:
            ir["annotated"] = emit_annotated(result.plan, dialect=dialect)
        if "partitioned" in emit:
            ir["partitioned"] = partitioned_ir(program, dialect, arguments, pipeline)
    document["phases"] = phases.to_json()
    return Deliverables(document, ir)
