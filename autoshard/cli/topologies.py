"""`autoshard topologies [--json]`: the shipped hardware profiles, one line each."""

from __future__ import annotations

import argparse
import json

from cost_models import GpuProfile, TpuProfile, list_profiles, load_profile
from autoshard.graph.summary import si


def links_text(profile: GpuProfile | TpuProfile) -> str:
    """The link levels in one line: one-way rates per GPU/chip, effective (or achievable) in brackets."""
    if isinstance(profile, GpuProfile):
        nvlink, network = profile.nvlink, profile.network
        best = max(nvlink.bytes_per_s_oneway_effective.values())
        nvls = ", NVLS" if nvlink.nvls is not None else ""
        return (f"NVLink {nvlink.domain_gpus} GPUs {si(nvlink.bytes_per_s_oneway_peak, 'B/s')} "
                f"({si(best, 'B/s')} eff.{nvls}); NIC {si(network.nic_bytes_per_s_oneway_peak, 'B/s')}/GPU "
                f"({si(network.nic_bytes_per_s_oneway_effective, 'B/s')} eff.)")
    ici = profile.ici
    largest = "x".join(map(str, ici.max_slice_shape))
    return (f"ICI {ici.torus_dims}-D torus up to {largest}, {ici.links_per_chip} links "
            f"{si(ici.link_bytes_per_s_oneway_peak, 'B/s')} ({si(ici.link_bytes_per_s_oneway_achievable, 'B/s')} "
            f"achievable); DCN {si(profile.dcn.bytes_per_s_oneway_per_chip, 'B/s')}/chip")


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("topologies", help="list the hardware topology profiles")
    parser.add_argument("--json", action="store_true", help="print the profiles as JSON")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    profiles = [load_profile(name) for name in list_profiles()]
    if args.json:
        print(json.dumps([{"name": p.name, "kind": p.kind, "chip": p.chip, "description": p.description,
                           "peak_flops_per_s": p.peak_flops_per_s, "hbm_bytes": p.hbm_bytes,
                           "hbm_bytes_per_s": p.hbm_bytes_per_s, "links": links_text(p)} for p in profiles], indent=1))
        return 0
    rows = [("name", "chip", "peak bf16", "HBM", "links (one-way)")]
    for p in profiles:
        rows.append((p.name, p.chip, si(p.peak_flops_per_s["bf16"], "FLOP/s"),
                     f"{si(p.hbm_bytes, 'B')} @ {si(p.hbm_bytes_per_s, 'B/s')}", links_text(p)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    return 0
