"""The numpy SPMD simulator: tensors laid out on every device of a mesh, and the mesh
collectives with the exact semantics of the MLIR `mesh` reference.

Device contents are `dict[Device, np.ndarray]` (device multi-index -> local tensor).
"""

from autoshard.sim.collectives import Shards
from autoshard.sim.layout import LayoutError, assemble, distribute
from autoshard.sim.reshard_exec import apply_resharding

__all__ = ["Shards", "LayoutError", "assemble", "distribute", "apply_resharding"]
