"""JAX: a jitted function in as an `autoshard.graph/v1` graph (`from_function`), the plan back out
as `PartitionSpec`s (`partition_specs`) and a function XLA runs under them (`shard`), and the
collectives XLA compiled, read back from its HLO (`compiled_collectives`) beside the plan's.

Modules, each importing only those before it: `runtime` (jax itself, imported on first use),
`trace` (the jaxpr with nested calls inlined and scans unrolled, as a flat program), `rows` (what
a row of the primitive table is), `indexing` (rows for gather and scatter), `convolution` (the
row for `conv_general_dilated`), `primitives` (one row per jax primitive: the graph ops it
becomes), `importer` (program to graph; `from_function`, `import_factory`), `specs` (shardings as
PartitionSpecs), `shard`, `hlo` (collectives in compiled HLO text), `collectives` (the plan's
collectives beside XLA's).

jax is an optional extra (`pip install autoshard[jax]`): importing this package does not import
it; the functions do, and say which extra to install when it is missing.

May import: everything below `frontends` (`graph`, `planning`, `spmd`, `delivery` and what they import).
"""

from __future__ import annotations

# None of these modules imports jax when imported: their functions do.
from autoshard.frontends.jax.collectives import compare_collectives, planned_collectives
from autoshard.frontends.jax.hlo import compiled_collectives
from autoshard.frontends.jax.importer import from_function, import_factory
from autoshard.frontends.jax.shard import shard
from autoshard.frontends.jax.specs import partition_specs

__all__ = ["compare_collectives", "compiled_collectives", "from_function", "import_factory", "partition_specs",
           "planned_collectives", "shard"]
