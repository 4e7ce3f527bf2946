"""Every published figure of tests/data/collective_reference.csv, priced by the cost model.

Each row names hardware, group size, collective, bytes per device (its input; all-gather: the
shard) and an expected time or bandwidth with a tolerance. Bandwidths are compared in the row's
own unit: busbw/algbw in the nccl-tests convention (all-gather size = the gathered buffer), and
`GBps_link_oneway` as the scaling book reports a wraparound-ring all-gather, V / (2 T) with
V = n * shard (its model is T = V / W_bidi, W_bidi = 2 x one-way link rate).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cost_models import algbw_bytes_per_s, bind, busbw_bytes_per_s, load_profile

ROWS = {row["id"]: row for row in csv.DictReader((Path(__file__).parent / "data" / "collective_reference.csv").open())}

KINDS = {"all-gather": "all_gather", "all-reduce": "all_reduce", "reduce-scatter": "reduce_scatter",
         "all-to-all": "all_to_all", "collective-permute (single point-to-point)": "send_recv"}


@dataclass(frozen=True)
class Setup:
    profile: str
    mesh: dict[str, int]
    axes: tuple[str, ...]
    slice_shape: tuple[int, ...] | None = None
    nvls: bool = True  # False: NCCL_NVLS_ENABLE=0 / NCCL_ALGO=Ring rows
    notes: dict = field(default_factory=dict)


V5E_8x4 = Setup("tpu-v5e", {"X": 8, "Y": 4}, ("Y",), slice_shape=(8, 4))
V4_CUBE = dict(profile="tpu-v4", mesh={"X": 4, "Y": 4, "Z": 4}, slice_shape=(4, 4, 4))
H100_8 = Setup("dgx-h100", {"tp": 8}, ("tp",))
H200_8 = Setup("dgx-h200", {"tp": 8}, ("tp",))
H100_4x8 = Setup("dgx-h100", {"dp": 4, "tp": 8}, ("dp", "tp"))
B200_4x8 = Setup("dgx-b200", {"dp": 4, "tp": 8}, ("dp", "tp"))

SETUPS = {
    "tpu-v5e-ag-ring16": Setup("tpu-v5e", {"x": 8, "y": 16}, ("y",), slice_shape=(8, 16)),
    "tpu-v5e-ag-nowrap-y4": V5E_8x4,
    "tpu-v5e-ag-nowrap-y4-small": V5E_8x4,
    "tpu-v4-ag-x": Setup(axes=("X",), **V4_CUBE),
    "tpu-v4-ar-z": Setup(axes=("Z",), **V4_CUBE),
    # send_recv over the whole 4x4 group is priced for its farthest pair: (0,0) -> (3,3).
    "tpu-v5e-p2p-4x4": Setup("tpu-v5e", {"x": 4, "y": 4}, ("x", "y"), slice_shape=(4, 4)),
    "h100-8-ar-nvls": H100_8,
    "h100-8-ar-ring": Setup("dgx-h100", {"tp": 8}, ("tp",), nvls=False),
    "h200-8-ag-16g": H200_8,
    "h200-8-rs-16g": H200_8,
    "h100-8-ag-1g": H100_8,
    "h100-4-ar-1g": Setup("dgx-h100", {"tp": 4}, ("tp",)),
    "h100-2-ar-1g": Setup("dgx-h100", {"tp": 2}, ("tp",)),
    "h100-8-ar-58m": Setup("dgx-h100", {"tp": 8}, ("tp",), nvls=False),
    "a100-8-ar-16g": Setup("dgx-a100", {"tp": 8}, ("tp",)),
    "a100-8-ar-32k": Setup("dgx-a100", {"tp": 8}, ("tp",)),
    "h200-8-ar-64m": H200_8,
    "b200-8-ar-nvls": Setup("dgx-b200", {"tp": 8}, ("tp",)),
    "b200-8-ar-ring": Setup("dgx-b200", {"tp": 8}, ("tp",), nvls=False),
    "b200-32-ar-16g": Setup("dgx-b200", {"dp": 4, "tp": 8}, ("dp", "tp")),
    "h100-multinode-ring-ar": Setup("dgx-h100", {"dp": 4, "tp": 8}, ("dp", "tp")),
    "h100-8-a2a": H100_8,
    "h100-8-ag-tiny": H100_8,
    "h100-8-ar-tiny": H100_8,
    "gb200-nvl72-ar": Setup("gb200-nvl72", {"tp": 72}, ("tp",)),
    **{f"h100-32-{kind}-{mib}m": H100_4x8 for kind in ("ar", "ag") for mib in (1, 4, 16, 64)},
    **{f"b200-32-ar-{mib}m": B200_4x8 for mib in (1, 4, 16, 64)},
}

UNMET = {
    "h100-8-ar-58m": (
        "the scaling book's ~150 GB/s busbw for a 58 MB ring all-reduce is read off a plot and has no second "
        "source; meeting it needs a ring efficiency <= 0.55 at 58 MB, while nccl-tests sweeps put it near 0.75 "
        "(8xH200: 346 busbw at 64 MiB; autoparallel's fitted ring ramp 0.68-0.79 at 4-8 MB per GPU). The "
        "model gives ~258 busbw; the reference itself flags the row as conflicting."),
}


def model_value(row_id: str) -> float:
    row, setup = ROWS[row_id], SETUPS[row_id]
    profile = load_profile(setup.profile)
    if not setup.nvls:
        profile = profile.without_nvls()
    topo = bind(profile, tuple(setup.mesh), tuple(setup.mesh.values()), slice_shape=setup.slice_shape)
    kind, n, b = KINDS[row["collective"]], topo.group_size(setup.axes), float(row["bytes_per_device"])
    if kind != "send_recv":
        assert n == int(row["axis_devices"]), "the binding must reproduce the row's group"
    seconds = topo.collective_seconds(kind, setup.axes, b)
    unit = row["unit"]
    if unit == "s":
        return seconds
    if unit == "GBps_busbw":
        return busbw_bytes_per_s(kind, n, b, seconds) / 1e9
    if unit == "GBps_algbw":
        return algbw_bytes_per_s(kind, n, b, seconds) / 1e9
    assert unit == "GBps_link_oneway" and kind == "all_gather"
    return n * b / (2 * seconds) / 1e9


def test_every_row_has_a_setup():
    assert set(SETUPS) == set(ROWS)


@pytest.mark.parametrize("row_id", [
    pytest.param(r, marks=pytest.mark.xfail(strict=True, reason=UNMET[r])) if r in UNMET else r for r in ROWS])
def test_reference_row_within_tolerance(row_id: str):
    row = ROWS[row_id]
    expected, tolerance = float(row["expected_seconds_or_GBps"]), float(row["tolerance_pct"]) / 100
    value = model_value(row_id)
    assert abs(value - expected) <= tolerance * expected, (
        f"{row_id}: model {value:.4g} vs expected {expected:.4g} {row['unit']} (±{row['tolerance_pct']}%)")
