"""Verifying a plan when it is made: partition it and run it in the simulator.

Small plans are verified by default (policy "auto"): their simulation fits in modest host
memory and takes seconds. Larger plans are skipped with the reason, and can be verified on a
smaller version of the graph with `autoshard simulate`.
"""

from __future__ import annotations

from typing import Any

from autoshard.errors import InputError, Problem
from autoshard.graph.summary import size
from autoshard.planning.microbatches import Microbatching, microbatch
from autoshard.planning.pipeline_cut import PipelineCut
from autoshard.sim.microbatch import simulate_microbatched
from autoshard.sim.pipelined import pipelined_bytes, simulate_pipelined
from autoshard.sim.program import simulate_program, simulation_bytes
from autoshard.sim.verdict import Verdict
from autoshard.spmd.program import SpmdProgram
from autoshard.spmd.staged import stage_program

VERIFY_POLICIES = ("auto", "always", "never")
AUTO_LIMIT_BYTES = 256 * 2 ** 20  # what "auto" simulates: seconds of numpy on one host
ALWAYS_LIMIT_BYTES = 8 * 2 ** 30


def policy_problem(policy: str, where: str) -> Problem:
    return Problem(where, f"unknown verification policy {policy!r}; expected one of {', '.join(VERIFY_POLICIES)}")


def verify_program(program: SpmdProgram, policy: str, seed: int = 0,
                   max_bytes: float = ALWAYS_LIMIT_BYTES, microbatching: Microbatching | None = None,
                   cut: PipelineCut | None = None) -> dict[str, Any]:
    """The verdict as JSON: `status` passed, failed or skipped (with `reason`); when run, the
    max error, the number of values checked and the first divergence (op, device, message).
    No simulation holds more than `max_bytes` of host memory, whatever the policy. With
    `microbatching`, `program` is the step on one microbatch, run as the step runs it: with
    `cut`, pipelined in its schedule's order (then `pipeline` gives each stage's items as run,
    its in-flight peak and the transfers between stages)."""
    if policy not in VERIFY_POLICIES:
        raise InputError([policy_problem(policy, "verify")])
    if policy == "never":
        return {"status": "skipped", "reason": "verification not requested"}
    count = microbatching.count if microbatching is not None else 1
    whole = microbatching.whole if microbatching is not None else program.graph
    needed = pipelined_bytes(program, cut.orders, whole) if cut is not None else simulation_bytes(program) * min(count, 2)
    limit = min(AUTO_LIMIT_BYTES, max_bytes) if policy == "auto" else max_bytes
    if needed > limit:
        return {"status": "skipped", "needs_bytes": needed,
                "reason": f"simulating this plan needs about {size(needed)} of host memory, over the "
                          f"{size(limit)} that verification '{policy}' allows; verify a smaller version of the graph "
                          f"with `autoshard simulate`"}
    if cut is not None:
        microbatching = microbatching if microbatching is not None else microbatch(program.graph, 1)
        run = simulate_pipelined(stage_program(program, cut), microbatching, seed=seed, max_bytes=limit)
        return {**_verdict_json(run.verdict, seed), "pipeline": run.to_json()}
    if count > 1:
        verdict = simulate_microbatched(program, microbatching, seed=seed, max_bytes=limit)
    else:
        verdict = simulate_program(program, seed=seed, max_bytes=limit)
    return _verdict_json(verdict, seed)


def _verdict_json(verdict: Verdict, seed: int) -> dict[str, Any]:
    return {"status": "passed" if verdict.passed else "failed", "seed": seed, "summary": verdict.summary(),
            **verdict.to_json()}
