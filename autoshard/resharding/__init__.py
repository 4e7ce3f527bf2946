"""Resharding: the cheapest sequence of collectives that turns one sharding of a tensor into another.

Everything that prices or runs a resharding (planning, spmd, mlir, sim) imports it from here.
The steps' exact semantics are in `README.md` beside this file.

Modules, each importing only those before it: `steps` (the steps, the plan and their prices),
`geometry` (device boxes, overlaps, the direct exchange), `moves` (the moves offered from a
state, exact for the tensor's sizes, priced and built into steps), `search` (the state space,
Dijkstra, `plan_resharding`, `resharding_cost`).

May import: the vocabulary (`errors`, `reductions`, `mesh`, `sharding`).
"""

from autoshard.resharding.search import PricedMoves, halo_step, plan_resharding, resharding_cost
from autoshard.resharding.steps import (STEP_KINDS, BytesMovedPrice, CollectiveStep, Price, Resharding, StepKind,
                                        Transfer, bytes_moved_price, step_kind)

__all__ = ["STEP_KINDS", "BytesMovedPrice", "CollectiveStep", "Price", "PricedMoves", "Resharding", "StepKind",
           "Transfer", "bytes_moved_price", "halo_step", "plan_resharding", "resharding_cost", "step_kind"]
