"""The kind tables and their readers: every step kind and every reduction kind has an entry
in every reader that lives in a later package, and an unknown kind is refused in one place."""

from __future__ import annotations

import numpy as np
import pytest

from autoshard.mesh import Mesh
from autoshard.mlir.collectives import STEP_PRINTERS
from autoshard.mlir.scalar import PAYLOAD_OPS
from autoshard.ops import OP_KINDS
from autoshard.ops.payloads import PAYLOADS
from autoshard.reductions import REDUCTION_KINDS, REDUCTIONS
from autoshard.resharding import STEP_KINDS, BytesMovedPrice, step_kind
from autoshard.sim.reshard_exec import STEP_RUNNERS


@pytest.mark.parametrize("readers", [STEP_RUNNERS, STEP_PRINTERS], ids=["simulator", "ir_printer"])
def test_every_step_kind_has_an_entry_in_every_reader(readers):
    assert list(readers) == list(STEP_KINDS)


def test_every_step_kind_is_priced_by_bytes_moved():
    price = BytesMovedPrice(Mesh.of(x=4))
    for kind in STEP_KINDS.values():
        assert price(kind.price_kind, ("x",), 1e9) >= 0.0
        assert kind.cut is None or kind.cut in kind.attrs
        assert not kind.padded or kind.cut is not None


def test_an_unknown_step_kind_is_refused():
    with pytest.raises(ValueError, match="unknown resharding step kind 'broadcast'"):
        step_kind("broadcast")


def test_every_reduction_kind_has_a_combiner_payload_and_an_identity():
    assert REDUCTION_KINDS == tuple(REDUCTIONS)
    for reduction in REDUCTIONS.values():
        assert PAYLOADS[reduction.combiner].combiner_of == reduction.name
        assert reduction.combiner in PAYLOAD_OPS
        assert set(reduction.passes_through) <= set(OP_KINDS)
        for dtype in (np.float32, np.int32, np.bool_):
            x = np.array([3, 0, 1], dtype)
            assert np.array_equal(reduction.pairwise(x, reduction.identity(dtype)), x)
            if reduction.idempotent:
                assert np.array_equal(reduction.pairwise(x, x), x)
