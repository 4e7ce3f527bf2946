"""JAX: a jitted function in as an `autoshard.graph/v1` graph (`from_function`), the plan back out
as `PartitionSpec`s (`partition_specs`) and a function XLA runs under them (`shard`), and the
collectives XLA compiled, read back from its HLO (`compiled_collectives`) beside the plan's.

Modules, each importing only those before it: `runtime` (jax itself, imported on first use),
`trace` (the jaxpr with nested calls inlined, as a flat program), `primitives` (one row per jax
primitive: the graph ops it becomes), `importer` (program to graph; `from_function`,
`import_factory`), `specs` (shardings as PartitionSpecs), `shard`, `hlo` (collectives in compiled
HLO text), `collectives` (the plan's collectives beside XLA's).

jax is an optional extra (`pip install autoshard[jax]`): importing this package does not import
it; the functions do, and say which extra to install when it is missing.

May import: everything below `frontends` (`graph`, `planning`, `spmd`, `delivery` and what they import).
"""

from __future__ import annotations

import importlib
from typing import Any

_NAMES = {
    "from_function": "autoshard.frontends.jax.importer",
    "import_factory": "autoshard.frontends.jax.importer",
    "partition_specs": "autoshard.frontends.jax.specs",
    "shard": "autoshard.frontends.jax.shard",
    "compiled_collectives": "autoshard.frontends.jax.hlo",
    "compare_collectives": "autoshard.frontends.jax.collectives",
}
__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module 'autoshard.frontends.jax' has no attribute {name!r}")
    return getattr(importlib.import_module(_NAMES[name]), name)
