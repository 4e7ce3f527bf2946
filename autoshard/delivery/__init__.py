"""What a user receives for a solved plan: the partitioned program after the collective
optimisations, the IR, the simulator's verdict, and the plan document `autoshard.plan/v1`.

May import: everything below it (`planning`, `spmd`, `mlir`, `sim` and what they import).
"""
