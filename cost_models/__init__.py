"""Hardware topology profiles and collective cost models.

Pure functions over published hardware numbers; knows nothing of graphs or autoshard's types.

    topo = bind(load_profile("dgx-h100"), ("dp", "tp"), (4, 8))
    topo.collective_seconds("all_reduce", ["dp"], 64 * 2**20)
"""

from cost_models.bandwidth import (algbw_bytes_per_s, bus_factor, busbw_bytes_per_s, collective_size_bytes,
                                   seconds_from_algbw, seconds_from_busbw)
from cost_models.collectives import COLLECTIVE_KINDS
from cost_models.errors import BindingError, ProfileError, TopologyError
from cost_models.profile import GpuProfile, TpuProfile, list_profiles, load_profile, parse_profile
from cost_models.topology import BoundTopology, bind

__all__ = [
    "COLLECTIVE_KINDS", "BindingError", "BoundTopology", "GpuProfile", "ProfileError", "TopologyError", "TpuProfile",
    "algbw_bytes_per_s", "bind", "bus_factor", "busbw_bytes_per_s", "collective_size_bytes", "list_profiles",
    "load_profile", "parse_profile", "seconds_from_algbw", "seconds_from_busbw",
]
