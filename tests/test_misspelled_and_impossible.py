"""Misspelled keys and impossible settings are refused, naming them: sharding JSON (a misspelled key
read as replicated, more dims than the tensor truncated), topology profiles (an infinite bandwidth,
an empty ramp) and `--nodes` with a TPU profile."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoshard.cli.main import main
from autoshard.errors import ShardingError
from autoshard.sharding import Sharding
from support.service import MLP, error_of

PROFILES = Path(__file__).parent.parent / "cost_models" / "profiles"
RESHARD = ["reshard", "--mesh", "x=2,y=2", "--shape", "6x6", "--to", "[]"]


@pytest.mark.parametrize("source, where, words", [
    ('{"split_axis": [["x"]]}', "--from split_axis", "did you mean 'split_axes'?"),
    ('{"split_axes": [["x"]], "halo": [1, 1]}', "--from halo", "did you mean 'halo_sizes'?"),
    ('{"split_axes": [["x"]], "partial": {"kind": "sum", "axis": ["y"]}}', "--from partial/axis",
     "did you mean 'axes'?"),
    ('[["x"], [], []]', "--from", "split_axes has 3 entries but the tensor has rank 2"),
    ('{"split_axes": [["x"]], "sharded_dims_offsets": [[0, 3, 6], [], []]}', "--from",
     "3 entries but the tensor has rank 2"),
    ('{"split_axes": [["x"]], "partial": {"kind": "sum", "axes": []}}', "--from partial/axes",
     "needs at least one mesh axis"),
    ('{"split_axes": [["x"]], "partial": {}}', "--from partial/axes", "needs at least one mesh axis"),
])
def test_reshard_refuses_a_misspelled_or_too_long_sharding_naming_it(capsys, source, where, words):
    assert main([*RESHARD, "--from", source]) == 2
    err = capsys.readouterr().err
    assert f"  {where}: " in err and words in err and "Traceback" not in err


def test_a_sharding_with_an_unknown_key_is_not_read_as_replicated():
    with pytest.raises(ShardingError) as error:
        Sharding.parse({"split_axes": [["x"]], "splits": []})
    assert [p.where for p in error.value.problems] == ["splits"]
    assert Sharding.parse({"split_axes": [["x"], []]}, rank=2).split_axes == (("x",),)


def profile_file(tmp_path: Path, change) -> str:
    data = json.loads((PROFILES / "dgx-h100.json").read_text())
    change(data)
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(data))  # json.dumps writes inf as Infinity, which json.loads reads back
    return str(path)


@pytest.mark.parametrize("change, where, words", [
    (lambda d: d["nvlink"].update(bytes_per_s_oneway_peak=float("inf")), "--topology nvlink.bytes_per_s_oneway_peak",
     "finite number"),
    (lambda d: d.update(hbm_bytes_per_s=float("nan")), "--topology hbm_bytes_per_s", "finite number"),
    (lambda d: d.update(bandwidth_ramp=[]), "--topology bandwidth_ramp", "is empty"),
])
def test_a_topology_file_with_an_infinite_bandwidth_or_empty_ramp_is_refused(tmp_path, capsys, change, where, words):
    argv = ["plan", "examples/mlp.json", "--mesh", "dp=2,tp=2", "--topology", profile_file(tmp_path, change)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"  {where}: " in err and words in err


@pytest.mark.parametrize("argv", [
    ["plan", "examples/mlp.json", "--mesh", "dp=2,tp=2", "--topology", "tpu-v5p", "--nodes", "1"],
    ["collective", "all_reduce", "--mesh", "x=4", "--bytes", "1MiB", "--topology", "tpu-v5e", "--nodes", "1"],
    [*RESHARD, "--from", "[]", "--topology", "tpu-v5e", "--nodes", "1"],
])
def test_nodes_with_a_tpu_profile_is_refused(capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "  --nodes: tpu-v5" in err and "is a TPU profile" in err


def test_rest_refuses_nodes_with_a_tpu_profile_and_an_infinite_bandwidth(http):
    response = http.post("/v1/plans", json={"graph": MLP, "mesh": "dp=2,tp=2", "topology": "tpu-v5p",
                                            "topology_options": {"nodes": 1}})
    assert response.status_code == 422
    assert [p["where"] for p in error_of(response)["problems"]] == ["/topology_options/nodes"]
    profile = json.loads((PROFILES / "dgx-h100.json").read_text())
    profile["nvlink"]["bytes_per_s_oneway_peak"] = float("inf")
    body = json.dumps({"graph": MLP, "mesh": "dp=2,tp=2", "topology": profile})  # Infinity, as Python reads it
    response = http.post("/v1/plans", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 422
    assert [p["where"] for p in error_of(response)["problems"]] == ["/topology/nvlink/bytes_per_s_oneway_peak"]


def test_collective_refuses_a_mesh_axis_mapped_twice(capsys):
    argv = ["collective", "all_reduce", "--mesh", "dp=2,tp=2", "--bytes", "1MiB", "--mapping", "dp=node,dp=gpu,tp=gpu"]
    assert main(argv) == 2
    assert "  --mapping: mesh axis 'dp' is mapped twice" in capsys.readouterr().err
