"""MLIR emission: the annotated module (a sharding on every value) and the partitioned SPMD
module (local shapes and mesh collectives; for a pipelined step one function per virtual stage,
with send/recv between stages), in the seed reference's `mesh` spelling or upstream LLVM 22's
`shard` spelling; and the real MLIR tools as verifiers.

May import: the vocabulary, `ops`, `resharding`, `graph`, `pipeline`, `planning`, `spmd`.
"""

from autoshard.mlir.annotated import emit_annotated
from autoshard.mlir.dialect import DIALECTS, MESH, SHARD, Dialect
from autoshard.mlir.partitioned import ARGUMENT_CONVENTIONS, emit_partitioned
from autoshard.mlir.pipelined import emit_pipelined
from autoshard.mlir.toolchain import ToolchainError, collectives, to_llvm19, upstream_partition, verify

__all__ = ["emit_annotated", "emit_partitioned", "emit_pipelined", "ARGUMENT_CONVENTIONS", "Dialect", "DIALECTS",
           "MESH", "SHARD", "verify", "to_llvm19", "upstream_partition", "collectives", "ToolchainError"]
