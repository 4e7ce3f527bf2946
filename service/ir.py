"""IR of a plan: annotated (a sharding on every value) or partitioned (per-device SPMD program)."""

from __future__ import annotations

from autoshard.delivery.deliver import partitioned_program
from autoshard.mlir import emit_annotated, emit_partitioned
from autoshard.planning.costs import Hardware
from autoshard.planning.plan import Plan


def ir_arguments(stage: str, arguments: str) -> str:
    """Only the partitioned IR depends on whether function arguments are local shards or global values."""
    return arguments if stage == "partitioned" else ""


def emit_ir(plan: Plan, hardware: Hardware, stage: str, dialect: str, arguments: str = "local",
            optimize_collectives: bool = True) -> str:
    """The partitioned IR's collectives are chosen with the hardware's prices, as the plan's
    reshardings are, then optimised unless asked not to: the program `autoshard plan` emits and
    simulates."""
    if stage == "annotated":
        return emit_annotated(plan, dialect=dialect)
    program, _ = partitioned_program(plan, hardware.collective_seconds, optimize_collectives)
    return emit_partitioned(program, dialect=dialect, arguments=arguments)
