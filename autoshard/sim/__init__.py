"""The numpy SPMD simulator: tensors laid out on every device of a mesh, and the mesh
collectives with the exact semantics of the MLIR `mesh` reference.

Device contents are `dict[Device, np.ndarray]` (device multi-index -> local tensor). `program`
runs a partitioned program on every device, `microbatch` a step over its microbatches and
`pipelined` a step over its pipeline's stages in the schedule's order; `verify` decides when a new
plan is run that way.

May import: the vocabulary, `ops`, `resharding`, `graph`, `pipeline`, `planning`, `spmd` (not `mlir`:
the simulator is an independent judge of the same plans).
"""

from autoshard.sim.collectives import Shards
from autoshard.sim.layout import LayoutError, assemble, distribute
from autoshard.sim.reshard_exec import apply_resharding

__all__ = ["Shards", "LayoutError", "assemble", "distribute", "apply_resharding"]
