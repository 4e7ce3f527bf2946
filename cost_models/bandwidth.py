"""Algorithm and bus bandwidth of a collective, in the nccl-tests convention.

`bytes_per_device` is each device's input buffer (all-gather, gather: its shard), as everywhere
in `cost_models`. nccl-tests' "size" is max(send, recv) per device: the gathered buffer for an
all-gather, the input otherwise. algbw = size / time; busbw = algbw * bus factor, which makes
ring collectives comparable with the link rate (reference, pitfalls D.1-D.2).
"""

from __future__ import annotations

import math


def collective_size_bytes(kind: str, n: int, bytes_per_device: float) -> float:
    """nccl-tests' size: bytes of the larger of a device's send and receive buffers."""
    return n * bytes_per_device if kind in ("all_gather", "gather") else bytes_per_device


def bus_factor(kind: str, n: int) -> float:
    if kind == "all_reduce":
        return 2 * (n - 1) / n
    if kind in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"):
        return (n - 1) / n
    return 1.0


def algbw_bytes_per_s(kind: str, n: int, bytes_per_device: float, seconds: float) -> float:
    size = collective_size_bytes(kind, n, bytes_per_device)
    return size / seconds if seconds > 0 else math.inf


def busbw_bytes_per_s(kind: str, n: int, bytes_per_device: float, seconds: float) -> float:
    return algbw_bytes_per_s(kind, n, bytes_per_device, seconds) * bus_factor(kind, n)


def seconds_from_algbw(kind: str, n: int, bytes_per_device: float, algbw: float) -> float:
    return collective_size_bytes(kind, n, bytes_per_device) / algbw


def seconds_from_busbw(kind: str, n: int, bytes_per_device: float, busbw: float) -> float:
    return collective_size_bytes(kind, n, bytes_per_device) * bus_factor(kind, n) / busbw
