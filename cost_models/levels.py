"""Collective time over one link level: a switch, a torus, or a network between nodes/slices.

A *level* is the part of a device group that sits on one kind of link: the GPUs of a group
inside one NVLink domain (`SwitchLevel`), the torus dims of a TPU slice it spans (`TorusLevel`),
or the nodes/slices it spans over NICs or DCN (`NetworkLevel`). Each prices every collective
kind for the devices of that level alone; `collectives.py` composes levels.

Byte conventions (`b` below): each device's input buffer (all-gather and gather: its shard).
`r` is the bandwidth ramp fraction (≤ 1) of the whole collective's size.
Formulas are those of the reference formula sheet (hardware.md, section B).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cost_models.profile import CopyEngineAllToAll, Nvls

PAIR_KINDS = ("shift", "send_recv")


def ring_wire_bytes(kind: str, n: int, b: float) -> float:
    """Bytes each device pushes through its port when `kind` runs as a ring/direct algorithm."""
    if kind == "all_gather" or kind == "gather":
        return (n - 1) * b  # a gather's root receives every other shard through its one port
    if kind in ("reduce_scatter", "all_to_all", "scatter"):
        return (n - 1) / n * b
    if kind == "all_reduce":
        return 2 * (n - 1) / n * b
    return b  # broadcast, reduce (pipelined chain), shift, send_recv


@dataclass(frozen=True, slots=True)
class SwitchLevel:
    """`n` GPUs of one NVLink/NVSwitch domain: a full crossbar, each GPU limited by its own port."""

    n: int
    bytes_per_s_oneway: float  # effective per-GPU one-way rate of ring collectives among n GPUs
    pair_bytes_per_s_oneway: float  # effective one-way rate between two GPUs
    latency_per_peer_s: float
    nvls: Nvls | None  # set when NVLink SHARP applies to this group
    alltoall: CopyEngineAllToAll | None

    def seconds(self, kind: str, b: float, r: float) -> float:
        if kind in PAIR_KINDS:
            return self.latency_per_peer_s + b / (self.pair_bytes_per_s_oneway * r)
        latency = self.latency_per_peer_s * (self.n - 1)
        if kind == "all_to_all" and self.alltoall is not None:
            a2a = self.alltoall
            transfer = ring_wire_bytes(kind, self.n, b) / a2a.bytes_per_s_oneway
            return max(a2a.latency_s, transfer) if a2a.latency_overlaps_transfer else a2a.latency_s + transfer
        ring = latency + ring_wire_bytes(kind, self.n, b) / (self.bytes_per_s_oneway * r)
        if kind == "all_reduce" and self.nvls is not None:
            # The switch reduces in place: same wire formula, higher rate, NCCL's fixed NVLS latency.
            nvls = self.nvls.latency_s + ring_wire_bytes(kind, self.n, b) / (
                self.bytes_per_s_oneway * self.nvls.allreduce_speedup * r)
            return min(ring, nvls)
        return ring


@dataclass(frozen=True, slots=True)
class NetworkLevel:
    """`n` nodes (GPU NICs) or slices (TPU DCN); every device of the group uses its own share."""

    n: int
    bytes_per_s_oneway: float  # per device
    latency_per_unit_s: float

    def seconds(self, kind: str, b: float, r: float) -> float:
        if kind in PAIR_KINDS:
            return self.latency_per_unit_s + b / (self.bytes_per_s_oneway * r)
        return self.latency_per_unit_s * (self.n - 1) + ring_wire_bytes(kind, self.n, b) / (self.bytes_per_s_oneway * r)


@dataclass(frozen=True, slots=True)
class TorusDim:
    """One torus dim as seen by a group: `size` chips, spaced `stride` apart on the physical ring."""

    size: int
    bytes_per_s_oneway: float  # per direction; a strided group shares each link with stride-1 others
    wraps: bool
    hop_s: float  # one logical hop = stride physical hops

    @property
    def gather_s_per_byte(self) -> float:
        """Seconds per gathered byte of an all-gather over this dim alone.

        Wraparound: both directions carry whole shards, ceil((X-1)/2) of them per link
        (= V/W_bidi for even X, the scaling book's formula). Line: an end chip receives X-1 shards
        through one link.
        """
        steps = math.ceil((self.size - 1) / 2) if self.wraps else self.size - 1
        return steps / (self.size * self.bytes_per_s_oneway)

    @property
    def hops(self) -> int:
        return self.size // 2 if self.wraps else self.size - 1

    @property
    def ports(self) -> int:
        return 2 if self.wraps else 1

    @property
    def alltoall_s_per_byte(self) -> float:
        """Busiest link of a shortest-path all-to-all: S*X/8 bytes per direction on a ring, S*X/4 on a line."""
        return self.size / ((8 if self.wraps else 4) * self.bytes_per_s_oneway)


@dataclass(frozen=True, slots=True)
class TorusLevel:
    """The torus dims of one TPU slice spanned by a group (ICI); per-dim terms folded at construction."""

    dims: tuple[TorusDim, ...]
    latency_overlaps_transfer: bool
    n: int
    path_s: float  # latency to the farthest member: every dim's hops
    gather_bytes_per_s: float  # gathered bytes per second (not a link rate): every dim's links at once
    alltoall_s_per_byte: float  # the busiest dim decides
    link_bytes_per_s_oneway: float  # slowest single link (pipelined chains)
    root_bytes_per_s_oneway: float  # into (or out of) one chip over all its links
    shift_latency_s: float  # without wraparound the last shard travels back X-1 hops

    @classmethod
    def of(cls, dims: tuple[TorusDim, ...], latency_overlaps_transfer: bool) -> "TorusLevel":
        return cls(dims, latency_overlaps_transfer, n=math.prod(d.size for d in dims),
                   path_s=sum(d.hops * d.hop_s for d in dims),
                   gather_bytes_per_s=sum(1 / d.gather_s_per_byte for d in dims),
                   alltoall_s_per_byte=max(d.alltoall_s_per_byte for d in dims),
                   link_bytes_per_s_oneway=min(d.bytes_per_s_oneway for d in dims),
                   root_bytes_per_s_oneway=sum(d.ports * d.bytes_per_s_oneway for d in dims),
                   shift_latency_s=max(d.hop_s if d.wraps else (d.size - 1) * d.hop_s for d in dims))

    def _time(self, latency: float, transfer: float) -> float:
        return max(latency, transfer) if self.latency_overlaps_transfer else latency + transfer

    def seconds(self, kind: str, b: float, r: float) -> float:
        if kind == "all_reduce":  # reduce-scatter, then all-gather of the reduced shard
            return 2 * self._time(self.path_s, b / (self.gather_bytes_per_s * r))
        if kind in ("all_gather", "reduce_scatter"):
            gathered = self.n * b if kind == "all_gather" else b
            return self._time(self.path_s, gathered / (self.gather_bytes_per_s * r))
        if kind == "all_to_all":
            return self._time(self.path_s, b * self.alltoall_s_per_byte / r)
        if kind in ("broadcast", "reduce"):  # pipelined along the dims
            return self._time(self.path_s, b / (self.link_bytes_per_s_oneway * r))
        if kind in ("gather", "scatter", "send_recv"):  # through every link of the root (farthest pair)
            return self._time(self.path_s, ring_wire_bytes(kind, self.n, b) / (self.root_bytes_per_s_oneway * r))
        return self._time(self.shift_latency_s, b / (self.link_bytes_per_s_oneway * r))  # shift to the next device
