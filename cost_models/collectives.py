"""Composing link levels into the time of one collective over a device group.

A group spans at most two levels: an inner one (NVLink domain or ICI torus dims) and an outer
one (nodes over NICs, or slices over DCN). Over two levels a collective runs hierarchically
(reference B.3 multislice, B.4.2): reduce-scatter inside, the reduced shard across, all-gather
inside; gathers cross the slow level first, while the data is smallest. On GPUs NCCL may
instead run one flat ring through every node, each node boundary crossed on all of the group's
NICs at once (B.4.1); the cheaper of the two is used, as NCCL's tuner picks the faster algorithm.
A GPU ring collective that crosses nodes also pays its protocol's cost on every ring step, by size
(LL/LL128 for small messages, Simple for large ones; the profile's `network.protocol_regimes`).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from cost_models.bandwidth import collective_size_bytes
from cost_models.levels import NetworkLevel, SwitchLevel, TorusLevel, ring_wire_bytes

COLLECTIVE_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "all_slice", "shift", "broadcast",
                    "reduce", "gather", "scatter", "send_recv")
_FLAT_RING_KINDS = ("all_reduce", "all_gather", "reduce_scatter")
# NCCL runs these as rings whose every step pays the protocol's handshake; its all-to-all, gathers and
# point-to-point sends are direct transfers (their multi-node fixed cost is in the link latencies).
_PROTOCOL_KINDS = _FLAT_RING_KINDS


@dataclass(frozen=True, slots=True)
class Ramp:
    """Fraction of link bandwidth a collective reaches, by its size; log-linear between points."""

    log2_sizes: tuple[float, ...] = ()
    fractions: tuple[float, ...] = ()

    @classmethod
    def of(cls, points: list[tuple[float, float]]) -> "Ramp":
        return cls(tuple(math.log2(size) for size, _ in points), tuple(f for _, f in points))

    def fraction(self, size_bytes: float) -> float:
        if not self.fractions:
            return 1.0
        x = math.log2(size_bytes) if size_bytes > 0 else -math.inf
        i = bisect.bisect_right(self.log2_sizes, x)
        if i == 0:
            return self.fractions[0]
        if i == len(self.fractions):
            return self.fractions[-1]
        x0, x1 = self.log2_sizes[i - 1], self.log2_sizes[i]
        f0, f1 = self.fractions[i - 1], self.fractions[i]
        return f0 + (f1 - f0) * (x - x0) / (x1 - x0)


@dataclass(frozen=True, slots=True)
class Protocols:
    """Fixed cost per ring step of a collective that crosses nodes, by collective size (NCCL's protocol regimes)."""

    until_bytes: tuple[float, ...] = ()  # largest size of every regime but the last
    step_latency_s: tuple[float, ...] = (0.0,)

    def step_s(self, size_bytes: float) -> float:
        return self.step_latency_s[bisect.bisect_left(self.until_bytes, size_bytes)]


@dataclass(frozen=True, slots=True)
class GroupCost:
    """Everything needed to price one collective kind over one group; evaluated per byte count."""

    kind: str
    n: int
    inner: SwitchLevel | TorusLevel | None
    outer: NetworkLevel | None
    launch_s: float
    ramp: Ramp
    flat_ring: bool  # set only for GPU groups (inner level a SwitchLevel): NCCL may run one flat ring
    protocols: Protocols = Protocols()  # set only for GPU groups that cross nodes

    def seconds(self, b: float) -> float:
        if self.n == 1 or self.kind == "all_slice":
            return 0.0
        size = collective_size_bytes(self.kind, self.n, b)
        r = self.ramp.fraction(size)
        inner, outer = self.inner, self.outer
        if outer is None:
            return self.launch_s + inner.seconds(self.kind, b, r)
        fixed = self.launch_s
        if self.kind in _PROTOCOL_KINDS:  # one protocol step per ring step, counted once per collective
            fixed += (self.n - 1) * self.protocols.step_s(size)
        if inner is None:
            return fixed + outer.seconds(self.kind, b, r)
        t = _hierarchical(self.kind, inner, outer, b, r)
        if self.flat_ring and self.kind in _FLAT_RING_KINDS:
            t = min(t, _flat_ring(self.kind, inner, outer, b, r))
        return fixed + t


def _hierarchical(kind: str, inner: SwitchLevel | TorusLevel, outer: NetworkLevel, b: float, r: float) -> float:
    n_in, n_out = inner.n, outer.n
    if kind == "all_reduce":
        return (inner.seconds("reduce_scatter", b, r) + outer.seconds("all_reduce", b / n_in, r)
                + inner.seconds("all_gather", b / n_in, r))
    if kind == "all_gather":
        return outer.seconds("all_gather", b, r) + inner.seconds("all_gather", n_out * b, r)
    if kind == "reduce_scatter":
        return inner.seconds("reduce_scatter", b, r) + outer.seconds("reduce_scatter", b / n_in, r)
    if kind == "all_to_all":  # different hardware, concurrent: the slower part decides
        return max(inner.seconds(kind, b / n_out, r), outer.seconds(kind, b, r))
    if kind == "broadcast":
        return outer.seconds(kind, b, r) + inner.seconds(kind, b, r)
    if kind == "reduce":
        return inner.seconds(kind, b, r) + outer.seconds(kind, b, r)
    if kind == "gather":
        return inner.seconds(kind, b, r) + outer.seconds(kind, n_in * b, r)
    if kind == "scatter":
        return outer.seconds(kind, b, r) + inner.seconds(kind, b / n_out, r)
    return max(inner.seconds(kind, b, r), outer.seconds(kind, b, r))  # shift, send_recv


def _flat_ring(kind: str, inner: SwitchLevel, outer: NetworkLevel, b: float, r: float) -> float:
    """One ring through all devices; each node boundary is crossed on every NIC of the group (B.4.1)."""
    n = inner.n * outer.n
    rate = min(inner.bytes_per_s_oneway, inner.n * outer.bytes_per_s_oneway) * r
    latency = inner.latency_per_peer_s * (inner.n - 1) + outer.latency_per_unit_s * (outer.n - 1)
    return latency + ring_wire_bytes(kind, n, b) / rate
