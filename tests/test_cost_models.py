"""Profiles, bindings and collective-cost properties of cost_models."""

from __future__ import annotations

import json
import math

import pytest

from cost_models import (
    COLLECTIVE_KINDS,
    BindingError,
    ProfileError,
    TopologyError,
    bind,
    list_profiles,
    load_profile,
    seconds_from_busbw,
)

SHIPPED = ["dgx-a100", "dgx-b200", "dgx-h100", "dgx-h200", "gb200-nvl72", "tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e"]


def raw(name: str) -> dict:
    return load_profile(name).model_dump(mode="json")


def numeric_fields(value, path=""):
    if isinstance(value, dict):
        for key, item in value.items():
            if key != "sources":
                yield from numeric_fields(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from numeric_fields(item, f"{path}.{i}")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield path


# -- profiles ---------------------------------------------------------------------------------

def test_shipped_profiles_are_listed():
    assert list_profiles() == SHIPPED


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_profile_loads_and_cites_every_number(name):
    profile = load_profile(name)
    assert profile.name == name
    assert profile.peak_flops_per_s["bf16"] > 0 and profile.hbm_bytes > 0
    cited = profile.sources
    uncited = [f for f in numeric_fields(raw(name))
               if not any(f == key or f.startswith(key + ".") for key in cited)]
    assert uncited == []


def test_pod_allreduce_bandwidth_matches_vendor_figure():
    # chips x links x one-way peak (reference A.2): v5e 51.2 TB/s, v6e 102.4 TB/s per 256-chip pod.
    for name, vendor in (("tpu-v5e", 51.2e12), ("tpu-v6e", 102.4e12)):
        ici = load_profile(name).ici
        assert math.prod(ici.max_slice_shape) * ici.links_per_chip * ici.link_bytes_per_s_oneway_peak == vendor


def test_missing_field_is_named():
    data = raw("dgx-h100")
    del data["nvlink"]["domain_gpus"]
    with pytest.raises(ProfileError) as error:
        load_profile(data)
    assert error.value.field == "nvlink.domain_gpus"
    assert "missing" in error.value.message


def test_negative_bandwidth_is_named():
    data = raw("tpu-v5p")
    data["ici"]["link_bytes_per_s_oneway_achievable"] = -9e10
    with pytest.raises(ProfileError) as error:
        load_profile(data)
    assert error.value.field == "ici.link_bytes_per_s_oneway_achievable"
    assert "-90000000000" in error.value.message


def test_every_problem_is_reported():
    data = raw("dgx-a100")
    data["hbm_bytes"] = 0
    data["network"]["nic_bytes_per_s_oneway_peak"] = "fast"
    with pytest.raises(ProfileError) as error:
        load_profile(data)
    assert [f for f, _ in error.value.problems] == ["hbm_bytes", "network.nic_bytes_per_s_oneway_peak"]


def test_inconsistent_profiles_are_refused():
    data = raw("dgx-h100")
    data["nvlink"]["bytes_per_s_oneway_effective"]["8"] = 5e11  # above the 450 GB/s line rate
    with pytest.raises(ProfileError, match="exceeds the peak") as error:
        load_profile(data)
    assert error.value.field == "nvlink"
    data = raw("dgx-h100")
    data["bandwidth_ramp"] = [[1e6, 0.1], [2e6, 0.5]]  # a 2 MB message would beat a 1 MB one
    with pytest.raises(ProfileError, match="rises too fast"):
        load_profile(data)
    data = raw("tpu-v4")
    data["kind"] = "fpga"
    with pytest.raises(ProfileError) as error:
        load_profile(data)
    assert error.value.field == "kind"


def test_profile_file_path_and_bad_files(tmp_path):
    path = tmp_path / "mine.json"
    data = raw("tpu-v5e") | {"name": "mine"}
    path.write_text(json.dumps(data))
    assert load_profile(str(path)).name == "mine"
    path.write_text("{not json")
    with pytest.raises(ProfileError, match="cannot read profile file"):
        load_profile(str(path))
    with pytest.raises(ProfileError) as error:
        load_profile("dgx-h900")
    assert error.value.field == "topology" and "dgx-h100" in error.value.message


def test_peak_flops_falls_back_for_unpublished_dtypes():
    topo = bind("tpu-v5e", ["x"], [4])
    assert topo.peak_flops("i8") == 3.94e14
    assert topo.peak_flops("f32") == topo.peak_flops("bf16") == 1.97e14
    assert topo.matmul_efficiency("bf16") == 1.0
    gpu = bind("dgx-h100", ["tp"], [8])
    assert gpu.peak_flops("f32") == 4.945e14 and gpu.matmul_efficiency("f32") == 0.803
    assert gpu.hbm_bytes == 80e9 and gpu.hbm_bytes_per_s == 3.35e12


# XLA's measured sm_90 GEMM rates (kDefaultMatmulPTable), FLOP/s: (batch, m, n, k) -> (bf16, f32)
XLA_SM90 = {(1, 4096, 4096, 4096): (783328793548203, 401589990188086),
            (1, 1024, 2048, 256): (139519467775467, 82342164417177),
            (2, 256, 2048, 2048): (332247798870580, 147979854465270),
            (1, 2048, 2048, 2048): (631984593290170, 329166714898835)}


def test_gemm_rates_follow_the_measured_sweep_between_and_beyond_its_shapes():
    gpu = bind("dgx-h100", ["tp"], [8])
    for shape, (bf16, f32) in XLA_SM90.items():  # at a measured shape: the measurement
        assert gpu.peak_flops("bf16") * gpu.matmul_efficiency("bf16", shape) == pytest.approx(bf16, rel=1e-3)
        assert gpu.peak_flops("f32") * gpu.matmul_efficiency("f32", shape) == pytest.approx(
            min(f32, 0.803 * gpu.peak_flops("f32")), rel=1e-3)  # never above the best rate
    # between two measured shapes (log2 midway in m), between their rates
    low, high = (gpu.matmul_efficiency("bf16", (1, m, 2048, 2048)) for m in (1024, 2048))
    assert low < gpu.matmul_efficiency("bf16", (1, 1448, 2048, 2048)) < high
    # beyond the grid: the nearest measured shape's rate; a batch past 4 stacks onto m
    assert gpu.matmul_efficiency("bf16", (1, 16384, 8192, 65536)) == gpu.matmul_efficiency("bf16", (1, 4096, 4096, 4096))
    assert gpu.matmul_efficiency("bf16", (16, 256, 512, 1024)) == gpu.matmul_efficiency("bf16", (4, 1024, 512, 1024))
    assert gpu.matmul_efficiency("bf16") == 0.803  # no shape: the best rate, what lower bounds use
    a100 = bind("dgx-a100", ["tp"], [8])  # no published sweep: one rate for every shape
    assert a100.matmul_efficiency("bf16", (1, 256, 256, 256)) == a100.matmul_efficiency("bf16") == 0.869


def test_a_sweep_that_is_not_a_full_grid_is_refused_naming_the_field():
    data = raw("dgx-h100")
    data["matmul_sweep"]["efficiency"]["bf16"] = data["matmul_sweep"]["efficiency"]["bf16"][:-1]
    with pytest.raises(ProfileError) as error:
        load_profile(data)
    assert error.value.field == "matmul_sweep" and "374 values" in error.value.message
    data = raw("dgx-h100")
    data["matmul_sweep"]["efficiency"]["f4"] = data["matmul_sweep"]["efficiency"]["f32"]
    with pytest.raises(ProfileError) as error:
        load_profile(data)
    assert "f4" in error.value.message


# -- binding ----------------------------------------------------------------------------------

def test_default_binding_puts_inner_axis_on_fastest_links():
    topo = bind("dgx-h100", ["dp", "tp"], [4, 8])
    assert topo.machine.describe() == "4 node(s) x 8 GPU(s)"
    assert topo.axis_link_class("tp") == "nvlink" and topo.axis_link_class("dp") == "network"
    assert topo.axis_bandwidth_bytes_per_s_oneway("tp") == pytest.approx(370e9, rel=1e-3)
    assert topo.axis_bandwidth_bytes_per_s_oneway("dp") == pytest.approx(47e9, rel=1e-3)
    assert topo.axis_latency_s("dp") > 0


def test_axis_spanning_two_torus_dims():
    topo = bind("tpu-v5p", ["a", "b"], [4, 16], slice_shape=(4, 4, 4))
    assert [topo.machine.dims[s.dim].name for s in topo.segments["b"]] == ["y", "z"]
    assert [topo.machine.dims[s.dim].name for s in topo.segments["a"]] == ["x"]
    # Multi-dim all-gather uses both dims' links: half the time of one dim for the same gathered bytes.
    one = topo.collective_seconds("all_gather", ["a"], 2**22)
    two = topo.collective_seconds("all_gather", ["b"], 2**20)
    assert two == pytest.approx(one / 2)


def test_axis_splitting_a_dim_and_axis_spanning_levels():
    topo = bind("dgx-h100", ["dp", "tp"], [8, 4], nodes=4)
    assert topo.describe_axis("tp") == "tp: gpu(4) [nvlink]"
    assert topo.describe_axis("dp") == "dp: node(4) x gpu(2/stride 4) [nvlink+network]"


def test_smallest_machine_is_inferred():
    assert bind("dgx-h100", ["tp"], [4]).machine.describe() == "1 node(s) x 4 GPU(s)"
    assert bind("tpu-v5p", ["x", "y", "z"], [4, 4, 4]).machine.slice_shape == (4, 4, 4)
    assert bind("tpu-v5e", ["x", "y"], [8, 16]).machine.slice_shape == (8, 16)
    multislice = bind("tpu-v5e", ["dcn", "x", "y"], [2, 16, 16])
    assert multislice.machine.describe() == "2 slice(s) of 16x16"
    assert multislice.axis_link_class("dcn") == "dcn"


def test_explicit_mapping():
    topo = bind("dgx-h100", ["a", "b"], [8, 4], nodes=4, mapping={"a": ["gpu"], "b": "node"})
    assert topo.axis_link_class("a") == "nvlink" and topo.axis_link_class("b") == "network"
    shared = bind("dgx-h100", ["a", "b"], [2, 4], mapping={"a": "gpu", "b": "gpu"})
    assert [(s.factor, s.stride) for s in shared.segments["a"]] == [(2, 4)]
    assert [(s.factor, s.stride) for s in shared.segments["b"]] == [(4, 1)]


@pytest.mark.parametrize("args, kwargs, field", [
    (("dgx-h100", ["a", "b"], [2, 12]), {"nodes": 3}, "mesh.b"),  # 12 does not factor into 3 nodes x 8 GPUs
    (("dgx-h100", ["tp"], [32]), {"nodes": 2}, "mesh"),  # larger than the machine
    (("dgx-h100", ["tp"], [12]), {}, "mesh"),  # not whole nodes
    (("dgx-h100", ["tp"], [8]), {"slice_shape": (2, 2, 2)}, "slice_shape"),
    (("tpu-v5e", ["x"], [32]), {"slice_shape": (4, 4)}, "mesh"),
    (("tpu-v5e", ["x"], [16]), {"slice_shape": (4, 4, 1)}, "slice_shape"),
    (("tpu-v5p", ["x"], [64]), {"slice_shape": (4, 4, 32)}, "slice_shape"),
    (("tpu-v5e", ["x"], [3]), {"nodes": 2}, "nodes"),  # nodes are GPU nodes; a TPU's slices come with a shape
    (("tpu-v5e", ["x"], [16]), {"nodes": 1}, "nodes"),
    (("dgx-h100", ["a", "b"], [8, 4]), {"nodes": 4, "mapping": {"a": "node", "b": "gpu"}}, "mapping.a"),
    (("dgx-h100", ["a", "b"], [4, 8]), {"nodes": 4, "mapping": {"a": "node", "b": "nvswitch"}}, "mapping.b"),
    (("dgx-h100", ["a", "b"], [4, 8]), {"nodes": 4, "mapping": {"a": "node"}}, "mapping.b"),
    (("dgx-h100", ["a"], [0]), {}, "mesh.a"),
])
def test_impossible_bindings_name_the_field(args, kwargs, field):
    with pytest.raises(BindingError) as error:
        bind(*args, **kwargs)
    assert isinstance(error.value, (TopologyError, ValueError))
    assert error.value.field == field


# -- collective costs -------------------------------------------------------------------------

@pytest.mark.parametrize("shape, axes", [((4, 4, 4), ["x"]), ((2, 4, 4), ["y"]), ((4, 4, 8), ["y", "z"])])
def test_all_reduce_is_reduce_scatter_plus_all_gather_on_a_ring(shape, axes):
    topo = bind("tpu-v4", ["x", "y", "z"], list(shape), slice_shape=shape)
    n, size = topo.group_size(axes), 3 * 2**20
    parts = topo.collective_seconds("reduce_scatter", axes, size) + topo.collective_seconds("all_gather", axes, size / n)
    assert topo.collective_seconds("all_reduce", axes, size) == pytest.approx(parts)


def test_missing_wraparound_turns_the_ring_into_a_line():
    shard = 2**20
    ring = bind("tpu-v4", ["x", "y", "z"], [4, 4, 8]).collective_seconds("all_gather", ["z"], shard)
    line = bind("tpu-v4", ["x", "y", "z"], [2, 4, 8]).collective_seconds("all_gather", ["z"], shard)
    assert ring == pytest.approx(4 * shard / 4.5e10)  # ceil(7/2) shards per link, both directions
    assert line == pytest.approx(7 * shard / 4.5e10)  # the end chip receives 7 shards through one link


def test_all_to_all_on_a_ring_grows_with_the_axis_while_all_gather_does_not():
    gathered = 2**26
    a2a, ag = [], []
    for x in (4, 8, 16):
        topo = bind("tpu-v4", ["x", "y", "z"], [4, 4, x], slice_shape=(4, 4, x))
        ag.append(topo.collective_seconds("all_gather", ["z"], gathered / x))
        a2a.append(topo.collective_seconds("all_to_all", ["z"], gathered))
    assert ag == pytest.approx([ag[0]] * 3)
    assert a2a == pytest.approx([a2a[0], 2 * a2a[0], 4 * a2a[0]])
    assert a2a[0] == pytest.approx(gathered * 4 / (8 * 4.5e10))  # V/(4 W_bidi) for a ring of 4


def test_nvls_only_speeds_up_large_enough_all_reduce_groups():
    h100 = load_profile("dgx-h100")
    size = 2**30
    with_nvls = bind(h100, ["tp"], [8]).collective_seconds("all_reduce", ["tp"], size)
    ring = bind(h100.without_nvls(), ["tp"], [8]).collective_seconds("all_reduce", ["tp"], size)
    assert ring / with_nvls == pytest.approx(1.3, rel=0.02)
    four = [bind(p, ["tp"], [4]).collective_seconds("all_reduce", ["tp"], size) for p in (h100, h100.without_nvls())]
    assert four[0] == four[1]
    gathers = [bind(p, ["tp"], [8]).collective_seconds("all_gather", ["tp"], size) for p in (h100, h100.without_nvls())]
    assert gathers[0] == gathers[1]


def test_data_parallel_across_nodes_runs_on_the_nics():
    topo = bind("dgx-h100", ["dp", "tp"], [4, 8])
    size = 2**34  # the ramp is at 1.0
    # launch, then per ring step the hop latency and the Simple protocol's cost (3 steps over 4 nodes)
    expected = 4.5e-6 + 3 * (7.4e-6 + 2.4e-6) + seconds_from_busbw("all_reduce", 4, size, 47e9)
    assert topo.collective_seconds("all_reduce", ["dp"], size) == pytest.approx(expected)
    # Flattened over both levels, the ring is bound by the node's 8 NICs, not one (8 x 24 GB/s HDR).
    a100 = bind("dgx-a100", ["dp", "tp"], [4, 8])
    assert a100.busbw_bytes_per_s("all_reduce", ["dp", "tp"], size) == pytest.approx(8 * 24e9, rel=0.01)


def test_ring_collectives_across_nodes_pay_the_protocol_cost_of_their_size():
    profile = load_profile("dgx-h100")
    plain = profile.model_copy(update={"network": profile.network.model_copy(update={"protocol_regimes": []})})
    topo, without = bind(profile, ["dp", "tp"], [4, 8]), bind(plain, ["dp", "tp"], [4, 8])

    def extra(kind, axes, size):
        bytes_per_device = size / 32 if kind == "all_gather" and len(axes) == 2 else size
        return topo.collective_seconds(kind, axes, bytes_per_device) - without.collective_seconds(kind, axes,
                                                                                                 bytes_per_device)

    # 31 ring steps over all 32 GPUs: LL/LL128 up to 2 MiB (the size nccl-tests prints), Simple above.
    for kind in ("all_reduce", "all_gather", "reduce_scatter"):
        assert extra(kind, ["dp", "tp"], 2**21) == pytest.approx(31 * 0.9e-6)
        assert extra(kind, ["dp", "tp"], 2**22) == pytest.approx(31 * 2.4e-6)
    assert extra("all_reduce", ["dp"], 2**22) == pytest.approx(3 * 2.4e-6)  # one GPU per node: 3 steps
    assert extra("all_reduce", ["tp"], 2**22) == 0  # inside a node
    assert extra("all_to_all", ["dp", "tp"], 2**22) == 0  # direct sends, not a ring
    assert extra("send_recv", ["dp"], 2**22) == 0
    data = raw("dgx-h100")
    data["network"]["protocol_regimes"] = [{"until_bytes": 2**21, "step_latency_s": 3e-6}, {"step_latency_s": 1e-6}]
    with pytest.raises(ProfileError, match="non-decreasing step_latency_s") as error:
        load_profile(data)
    assert error.value.field == "network"
    data["network"]["protocol_regimes"] = [{"step_latency_s": 1e-6}, {"until_bytes": 2**21, "step_latency_s": 3e-6}]
    with pytest.raises(ProfileError, match="increasing until_bytes"):
        load_profile(data)


def test_multislice_all_reduce_is_hierarchical():
    topo = bind("tpu-v5p", ["dcn", "x", "y", "z"], [2, 4, 4, 4], nodes=2, slice_shape=(4, 4, 4))
    size = 2**30
    ici = topo.collective_seconds("reduce_scatter", ["x", "y", "z"], size)
    dcn = 2e-5 + size / 64 / 6.25e9  # all-reduce of each chip's 1/64 over 2 slices: (k-1)/k * 2 = 1
    assert topo.collective_seconds("all_reduce", ["dcn", "x", "y", "z"], size) == pytest.approx(2 * ici + dcn)


BINDINGS = [("dgx-a100", ["dp", "tp"], [2, 8]), ("dgx-h100", ["dp", "tp"], [4, 8]), ("dgx-b200", ["tp"], [8]),
            ("gb200-nvl72", ["dp", "tp"], [2, 72]), ("tpu-v4", ["x", "y", "z"], [4, 4, 4]),
            ("tpu-v5e", ["x", "y"], [4, 4]), ("tpu-v5p", ["dcn", "x", "y", "z"], [2, 4, 4, 8]),
            ("tpu-v6e", ["x", "y"], [16, 16])]


@pytest.mark.parametrize("name, axes, sizes", BINDINGS)
def test_cost_is_monotone_in_bytes(name, axes, sizes):
    topo = bind(name, axes, sizes)
    groups = [axes[-1:], axes[:1], axes]
    for kind in COLLECTIVE_KINDS:
        for group in groups:
            times = [topo.collective_seconds(kind, group, 2.0**e) for e in range(0, 38)]
            assert all(a <= b * (1 + 1e-12) for a, b in zip(times, times[1:])), (kind, group)
            assert (kind == "all_slice") == (times[-1] == 0)


@pytest.mark.parametrize("name", ["dgx-a100", "dgx-h100", "gb200-nvl72", "tpu-v5e", "tpu-v4"])
def test_all_gather_cost_grows_with_the_group(name):
    """At a fixed shard per device, a larger group over the same kind of links gathers more."""
    if name.startswith("tpu"):
        shapes = [(2, 2), (4, 4), (16, 16)] if name == "tpu-v5e" else [(2, 2, 2), (4, 4, 4), (8, 8, 8)]
        sequences = [[(bind(name, list("xyz"[:len(s)]), list(s)), list("xyz"[:len(s)])) for s in shapes]]
    else:
        domain = load_profile(name).nvlink.domain_gpus
        sequences = [[(bind(name, ["tp"], [n]), ["tp"]) for n in (2, 3, 4, 6, domain)],
                     [(bind(name, ["dp", "tp"], [k, domain]), ["dp"]) for k in (2, 4, 16)]]
    for shard in (1e3, 1e6, 1e9):
        for sequence in sequences:
            times = [topo.collective_seconds("all_gather", group, shard) for topo, group in sequence]
            assert times == sorted(times)


def test_ring_all_reduce_grows_with_the_group_inside_a_node():
    profile = load_profile("dgx-h100").without_nvls()
    times = [bind(profile, ["tp"], [n]).collective_seconds("all_reduce", ["tp"], 2**28) for n in range(2, 9)]
    assert times == sorted(times)


def test_helpers_and_requests_that_cannot_be_priced():
    topo = bind("dgx-h100", ["dp", "tp"], [2, 8])
    assert topo.collective_seconds("all_slice", ["tp"], 1e9) == 0
    assert topo.collective_seconds("all_reduce", [], 1e9) == 0
    assert topo.collective_seconds("all_reduce", ["tp"], 0) == pytest.approx(4.5e-6 + 2.5e-5)  # launch + NVLS
    seconds = topo.collective_seconds("all_gather", ["tp"], 2**27)
    assert topo.algbw_bytes_per_s("all_gather", ["tp"], 2**27) == pytest.approx(8 * 2**27 / seconds)
    assert topo.busbw_bytes_per_s("all_gather", ["tp"], 2**27) == pytest.approx(7 * 2**27 / seconds)
    for kind, axes, size, field in (("allreduce", ["tp"], 1, "kind"), ("all_reduce", ["pp"], 1, "axes"),
                                    ("all_reduce", ["tp", "tp"], 1, "axes"), ("all_reduce", ["tp"], -1,
                                                                               "bytes_per_device")):
        with pytest.raises(TopologyError) as error:
            topo.collective_seconds(kind, axes, size)
        assert error.value.field == field
