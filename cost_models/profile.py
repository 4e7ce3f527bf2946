"""Topology profiles: the published hardware numbers the cost models use, validated on load.

A profile is one JSON file (shipped ones live in `cost_models/profiles/`). Field names carry
their units (`_bytes`, `_s`, `_bytes_per_s_oneway`); `sources` maps a field path (or the path of
a whole section) to the reference keys the numbers come from. Two kinds exist:

* `gpu`: an NVLink/NVSwitch domain (`nvlink`) per node, one NIC per GPU between nodes (`network`).
* `tpu`: a 2-D/3-D ICI torus per slice (`ici`), data-centre network between slices (`dcn`).

Every schema problem is reported with the dotted path of the offending field.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping, Union

from pydantic import (BaseModel, ConfigDict, Field, NonNegativeFloat, PositiveFloat, PositiveInt, TypeAdapter,
                      ValidationError, field_validator, model_validator)

from cost_models.errors import ProfileError

Fraction = Annotated[float, Field(gt=0, le=1)]


class _Section(BaseModel):
    # a profile's numbers are finite: an infinite bandwidth would price every collective at zero
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Nvls(_Section):
    """NVLink SHARP: the switch reduces, so an all-reduce moves each byte over a GPU's links once."""

    min_gpus: int = Field(ge=2)  # NCCL only picks NVLS for groups at least this large
    allreduce_speedup: float = Field(ge=1)  # NVLS all-reduce bandwidth over ring all-reduce bandwidth
    latency_s: NonNegativeFloat  # replaces the launch latency (NCCL's NVLS latency)


class CopyEngineAllToAll(_Section):
    """All-to-all done by copy engines over NVSwitch (Hopper and later): its own rate and fixed cost."""

    bytes_per_s_oneway: PositiveFloat
    latency_s: NonNegativeFloat
    latency_overlaps_transfer: bool


class NvlinkLevel(_Section):
    domain_gpus: PositiveInt
    bytes_per_s_oneway_peak: PositiveFloat
    # Effective per-GPU one-way rate of ring collectives, by number of GPUs in the group
    # (bus bandwidth, measured); group sizes in between are interpolated.
    bytes_per_s_oneway_effective: dict[int, PositiveFloat] = Field(min_length=1)
    latency_per_peer_s: NonNegativeFloat
    nvls: Nvls | None = None
    alltoall: CopyEngineAllToAll | None = None

    @model_validator(mode="after")
    def _consistent(self) -> "NvlinkLevel":
        for gpus, rate in self.bytes_per_s_oneway_effective.items():
            if not 2 <= gpus <= self.domain_gpus:
                raise ValueError(f"bytes_per_s_oneway_effective: group size {gpus} is outside 2..{self.domain_gpus}")
            if rate > self.bytes_per_s_oneway_peak:
                raise ValueError(f"bytes_per_s_oneway_effective[{gpus}] = {rate:g} exceeds the peak "
                                 f"{self.bytes_per_s_oneway_peak:g}")
        return self


class ProtocolRegime(_Section):
    """The collective sizes over which NCCL runs one protocol across nodes (LL/LL128 for small messages,
    Simple for large ones) and the fixed cost that protocol adds to each ring step, on top of the links'
    hop latencies (its flag handshakes and chunk pipeline)."""

    until_bytes: PositiveFloat | None = None  # largest collective size (nccl-tests' size) in the regime; None: no limit
    step_latency_s: NonNegativeFloat


class NetworkLevel(_Section):
    name: str
    nic_bytes_per_s_oneway_peak: PositiveFloat
    nic_bytes_per_s_oneway_effective: PositiveFloat
    latency_per_node_s: NonNegativeFloat
    # Regimes of ring collectives (all-reduce, all-gather, reduce-scatter) that cross nodes, smallest sizes first.
    protocol_regimes: list[ProtocolRegime] = []

    @model_validator(mode="after")
    def _consistent(self) -> "NetworkLevel":
        if self.nic_bytes_per_s_oneway_effective > self.nic_bytes_per_s_oneway_peak:
            raise ValueError("nic_bytes_per_s_oneway_effective exceeds nic_bytes_per_s_oneway_peak")
        regimes = self.protocol_regimes
        limits = [regime.until_bytes for regime in regimes]
        if regimes and (None in limits[:-1] or limits[-1] is not None or limits[:-1] != sorted(set(limits[:-1]))):
            raise ValueError("protocol_regimes must have increasing until_bytes and leave it out on the last regime")
        steps = [regime.step_latency_s for regime in regimes]
        if steps != sorted(steps):
            # A collective one byte past a regime's limit would otherwise be cheaper than one at the limit.
            raise ValueError("protocol_regimes must have non-decreasing step_latency_s")
        return self


class Wraparound(_Section):
    """Which torus dims of a slice have wraparound links.

    `all_dims_multiple_of` (v4, v5p cube rule): every dim wraps when all dims are multiples of
    `value`, none otherwise. `dim_equals` (v5e, v6e): a dim wraps when its length is `value`.
    """

    rule: Literal["all_dims_multiple_of", "dim_equals"]
    value: PositiveInt


class IciLevel(_Section):
    torus_dims: int = Field(ge=1, le=3)
    max_slice_shape: list[PositiveInt]
    links_per_chip: PositiveInt
    link_bytes_per_s_oneway_achievable: PositiveFloat
    link_bytes_per_s_oneway_peak: PositiveFloat
    hop_latency_s: NonNegativeFloat
    latency_overlaps_transfer: bool  # the scaling book prices ICI collectives as max(latency, transfer)
    wraparound: Wraparound

    @model_validator(mode="after")
    def _consistent(self) -> "IciLevel":
        if len(self.max_slice_shape) != self.torus_dims:
            raise ValueError(f"max_slice_shape has {len(self.max_slice_shape)} dims, torus_dims is {self.torus_dims}")
        if self.link_bytes_per_s_oneway_achievable > self.link_bytes_per_s_oneway_peak:
            raise ValueError("link_bytes_per_s_oneway_achievable exceeds link_bytes_per_s_oneway_peak")
        return self


class DcnLevel(_Section):
    bytes_per_s_oneway_per_chip: PositiveFloat
    latency_per_slice_s: NonNegativeFloat


class MatmulSweep(_Section):
    """Measured GEMM rates on a grid of shapes: per dtype, the achieved rate over the dtype's peak
    for every (batch, m, n, k) in `batches` x `dims` x `dims` x `dims`, listed batch-major, then
    m, n, k (`cost_models.compute` interpolates it)."""

    batches: list[PositiveInt] = Field(min_length=1)
    dims: list[PositiveInt] = Field(min_length=2)
    efficiency: dict[str, list[Fraction]] = Field(min_length=1)

    @model_validator(mode="after")
    def _full_grid(self) -> "MatmulSweep":
        for name, values in (("batches", self.batches), ("dims", self.dims)):
            if values != sorted(set(values)):
                raise ValueError(f"{name} must be increasing, got {values}")
        points = len(self.batches) * len(self.dims) ** 3
        for dtype, values in self.efficiency.items():
            if len(values) != points:
                raise ValueError(f"efficiency.{dtype} has {len(values)} values; the grid has {points} "
                                 f"({len(self.batches)} batches x {len(self.dims)}**3 shapes)")
        return self


class _ChipProfile(_Section):
    name: str = Field(min_length=1)
    description: str
    chip: str
    peak_flops_per_s: dict[str, PositiveFloat] = Field(min_length=1)
    # Dtypes without a published peak are priced at this dtype's rate (see `BoundTopology.peak_flops`).
    fallback_dtype: str
    matmul_efficiency: dict[str, Fraction] = {}
    # GEMM rates by shape where a sweep is published; without one a GEMM runs at matmul_efficiency
    matmul_sweep: MatmulSweep | None = None
    hbm_bytes: PositiveInt
    hbm_bytes_per_s: PositiveFloat
    # (collective size in bytes, fraction of link bandwidth reached), sizes increasing; None (left
    # out): full bandwidth at every size.
    bandwidth_ramp: list[tuple[PositiveFloat, Fraction]] | None = None
    sources: dict[str, list[str]] = {}

    @field_validator("bandwidth_ramp")
    @classmethod
    def _ramp_has_points(cls, ramp: list[tuple[float, float]] | None) -> list[tuple[float, float]] | None:
        if ramp is not None and not ramp:
            raise ValueError("is empty: give at least one [size, fraction] point, or leave it out for full "
                             "bandwidth at every size")
        return ramp

    @model_validator(mode="after")
    def _consistent(self) -> "_ChipProfile":
        if self.fallback_dtype not in self.peak_flops_per_s:
            raise ValueError(f"fallback_dtype {self.fallback_dtype!r} has no entry in peak_flops_per_s")
        swept = set(self.matmul_sweep.efficiency) if self.matmul_sweep else set()
        if swept - set(self.peak_flops_per_s):
            raise ValueError(f"matmul_sweep.efficiency has dtypes {sorted(swept - set(self.peak_flops_per_s))} "
                             "without an entry in peak_flops_per_s")
        ramp = self.bandwidth_ramp or []
        sizes = [size for size, _ in ramp]
        fractions = [fraction for _, fraction in ramp]
        if sizes != sorted(set(sizes)) or fractions != sorted(fractions):
            raise ValueError("bandwidth_ramp must have increasing sizes and non-decreasing fractions")
        for (s0, f0), (s1, f1) in zip(ramp, ramp[1:]):
            # Interpolated in log2(size): the fraction may not outgrow the size, or a larger message
            # would take less time.
            if (f1 - f0) / math.log2(s1 / s0) > f0 * math.log(2):
                raise ValueError(f"bandwidth_ramp rises too fast between {s0:g} and {s1:g} bytes: "
                                 "a larger collective would take less time")
        return self


class GpuProfile(_ChipProfile):
    kind: Literal["gpu"]
    launch_latency_s: NonNegativeFloat
    nvlink: NvlinkLevel
    network: NetworkLevel

    def without_nvls(self) -> "GpuProfile":
        """The same machine with NVLink SHARP disabled (NCCL_NVLS_ENABLE=0)."""
        return self.model_copy(update={"nvlink": self.nvlink.model_copy(update={"nvls": None})})


class TpuProfile(_ChipProfile):
    kind: Literal["tpu"]
    ici: IciLevel
    dcn: DcnLevel


Profile = Annotated[Union[GpuProfile, TpuProfile], Field(discriminator="kind")]
_PROFILE = TypeAdapter(Profile)
_PACKAGE = "cost_models.profiles"


def parse_profile(data: Any) -> GpuProfile | TpuProfile:
    """Validate a decoded profile; every problem names its field (`nvlink.domain_gpus`, ...)."""
    try:
        return _PROFILE.validate_python(data)
    except ValidationError as error:
        problems = [_problem(e) for e in error.errors()]
        raise ProfileError(*problems[0], more=problems[1:]) from None


def _problem(error: Mapping[str, Any]) -> tuple[str, str]:
    kind = error["type"]
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        return "kind", "must be 'gpu' or 'tpu'"
    loc = [str(part) for part in error["loc"]]
    if loc and loc[0] in ("gpu", "tpu"):  # the union's tag, not a field
        loc = loc[1:]
    if kind == "missing":
        message = "required field is missing"
    elif kind == "extra_forbidden":
        message = "unknown field"
    else:
        message = error["msg"].removeprefix("Value error, ")
        if not isinstance(error["input"], (dict, list)):
            message += f" (got {error['input']!r})"
    return ".".join(loc) or "profile", message


def list_profiles() -> list[str]:
    """Names of the shipped profiles, sorted."""
    return sorted(p.name.removesuffix(".json") for p in resources.files(_PACKAGE).iterdir()
                  if p.name.endswith(".json"))


@lru_cache(maxsize=None)
def _shipped(name: str) -> GpuProfile | TpuProfile:
    text = resources.files(_PACKAGE).joinpath(f"{name}.json").read_text(encoding="utf-8")
    return parse_profile(json.loads(text))


def load_profile(source: "str | Path | Mapping[str, Any] | GpuProfile | TpuProfile") -> GpuProfile | TpuProfile:
    """A profile from a shipped name (`dgx-h100`), a JSON file path, a decoded mapping, or a profile."""
    if isinstance(source, (GpuProfile, TpuProfile)):
        return source
    if isinstance(source, Mapping):
        return parse_profile(dict(source))
    text = str(source)
    if text in list_profiles():
        return _shipped(text)
    path = Path(text)
    if not path.is_file():
        raise ProfileError("topology", f"unknown profile {text!r}: not a shipped profile ({', '.join(list_profiles())})"
                                       " nor a JSON file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ProfileError("topology", f"cannot read profile file {text!r}: {error}") from None
    return parse_profile(data)
