"""Resharding: the cheapest sequence of collectives that turns one sharding of a tensor into another.

Everything that prices or runs a resharding (planning, spmd, mlir, sim) imports it from here.
The steps' exact semantics are in `README.md` beside this file.

May import: the vocabulary and `ops`.
"""

from autoshard.resharding.planner import (STEP_KINDS, BytesMovedPrice, CollectiveStep, Price, PricedMoves, Resharding,
                                          Transfer, bytes_moved_price, plan_resharding, resharding_cost)

__all__ = ["STEP_KINDS", "BytesMovedPrice", "CollectiveStep", "Price", "PricedMoves", "Resharding", "Transfer",
           "bytes_moved_price", "plan_resharding", "resharding_cost"]
