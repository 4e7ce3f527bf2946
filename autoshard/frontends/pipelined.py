"""The refusal of a pipelined plan by the frontends that run one SPMD program on one mesh.

A pipelined plan (`plan --pipeline S`, `planning.pipeline_plan`) runs each stage's part of the
graph on its own sub-mesh, microbatch by microbatch, passing activations and gradients between
stages; JAX `shard` and DTensor `parallelize` run the whole graph on one mesh, so they would run
it unpipelined on a mesh that is one stage's. They refuse it by name instead.
"""

from __future__ import annotations

from typing import Any, Mapping

from autoshard.errors import InputError
from autoshard.planning.pipeline_plan import PipelinedPlan

# The pipelining entry: an exported program cut at a pipelined plan's boundaries into
# torch.distributed.pipelining stages (issue 32)
PIPELINE_ENTRY = "autoshard.frontends.torch.pipeline"


def refuse_pipelined(plan: Any, entry: str) -> None:
    """Raise naming `entry` (the caller, e.g. `parallelize`) when `plan` is pipelined: a
    `PipelinedPlan` or a plan document with a `pipeline` section."""
    if isinstance(plan, PipelinedPlan) or (isinstance(plan, Mapping) and "pipeline" in plan):
        raise InputError(f"the plan is pipelined (its stages each run on their own sub-mesh); {entry} runs the whole "
                         f"graph as one program on one mesh and cannot run the stages: run them through "
                         f"torch.distributed.pipelining with {PIPELINE_ENTRY}", "plan")
