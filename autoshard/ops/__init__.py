"""The op table (`OP_KINDS`), loop nests and payloads.

Also reverse-mode differentiation (`differentiate`), a transform of ops into gradient ops.

May import: the vocabulary (`errors`, `dtypes`, `affine`, `reductions`).
"""

from autoshard.ops import (contraction, elementwise, generic, indexing, nn, opaque, reduction, selection,  # noqa: F401
                           structural)  # (rows register)
from autoshard.ops import grads  # noqa: F401  (after the rows it differentiates)
from autoshard.ops.loops import INVALID, PARALLEL, REDUCTION, Block, LoopNest
from autoshard.ops.table import OP_KINDS, Context, OpError, OpKind, evaluate, evaluate_block

__all__ = ["OP_KINDS", "OpKind", "OpError", "LoopNest", "Block", "Context", "evaluate", "evaluate_block",
           "PARALLEL", "REDUCTION", "INVALID"]
