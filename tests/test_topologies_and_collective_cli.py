"""The `topologies` and `collective` commands: output, JSON, and input errors (exit 2, no traceback)."""

from __future__ import annotations

import json

import pytest

from cost_models import list_profiles, load_profile
from autoshard.cli.main import main


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_topologies_lists_every_profile(capsys):
    code, out, _ = run(capsys, "topologies")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["name", "chip", "peak"]
    assert [line.split()[0] for line in lines[1:]] == list_profiles()
    h100 = next(line for line in lines if line.startswith("dgx-h100"))
    assert "989 TFLOP/s" in h100 and "80 GB @ 3.35 TB/s" in h100 and "NVLink 8 GPUs 450 GB/s" in h100


def test_topologies_json(capsys):
    code, out, _ = run(capsys, "topologies", "--json")
    assert code == 0
    profiles = {p["name"]: p for p in json.loads(out)}
    assert set(profiles) == set(list_profiles())
    assert profiles["tpu-v5p"]["peak_flops_per_s"]["bf16"] == 4.59e14
    assert profiles["tpu-v5p"]["hbm_bytes"] == 95 * 2**30


def test_collective_prints_time_and_bandwidths(capsys):
    code, out, _ = run(capsys, "collective", "all_reduce", "--topology", "dgx-h100", "--nodes", "4",
                       "--mesh", "dp=4,tp=8", "--axes", "dp", "--bytes", "1GiB")
    assert code == 0
    assert "dp: node(4) [network]" in out and "tp: gpu(8) [nvlink]" in out
    # one NDR NIC per GPU: 47 GB/s effective x 0.97 ramp at 1 GiB, less 3 ring steps of the Simple protocol
    assert "busbw: 45.5 GB/s" in out


def test_collective_json_matches_the_library(capsys):
    code, out, _ = run(capsys, "collective", "all_gather", "--topology", "tpu-v4", "--slice", "4x4x4",
                       "--mesh", "x=4,y=4,z=4", "--axes", "x", "--bytes", "524288", "--json")
    assert code == 0
    result = json.loads(out)
    assert result["seconds"] == pytest.approx(2.33e-5, rel=1e-3)  # the scaling book's worked example
    assert result["group_size"] == 4 and result["link_class"] == "ici"
    assert result["algbw_bytes_per_s"] == pytest.approx(4 * 524288 / result["seconds"])


def test_collective_with_mapping_profile_file_and_no_nvls(capsys, tmp_path):
    path = tmp_path / "h100.json"
    path.write_text(json.dumps(load_profile("dgx-h100").model_dump(mode="json")))
    args = ["collective", "all_reduce", "--topology", str(path), "--mesh", "tp=8", "--bytes", "8GiB", "--json"]
    nvls = json.loads(run(capsys, *args)[1])
    ring = json.loads(run(capsys, *args, "--no-nvls")[1])
    assert ring["busbw_bytes_per_s"] == pytest.approx(366e9, rel=0.01)
    assert nvls["seconds"] < ring["seconds"]
    code, out, _ = run(capsys, "collective", "all_reduce", "--topology", "dgx-h100", "--nodes", "4",
                       "--mesh", "a=8,b=4", "--mapping", "a=gpu,b=node", "--axes", "b", "--bytes", "1MB", "--json")
    assert code == 0 and json.loads(out)["link_class"] == "network"


def test_all_slice_is_free(capsys):
    code, out, _ = run(capsys, "collective", "all_slice", "--topology", "tpu-v5e", "--mesh", "x=4", "--bytes", "1GB",
                       "--json")
    assert code == 0
    result = json.loads(out)
    assert result["seconds"] == 0 and result["busbw_bytes_per_s"] is None


@pytest.mark.parametrize("argv, where", [
    (["--topology", "dgx-h900", "--mesh", "tp=8"], "--topology: unknown profile 'dgx-h900'"),
    (["--topology", "dgx-h100", "--nodes", "2", "--mesh", "tp=32"], "--mesh: the mesh has 32 devices"),
    (["--topology", "tpu-v5e", "--slice", "4x4", "--mesh", "x=32"], "--mesh: the mesh has 32 devices"),
    (["--topology", "dgx-h100", "--nodes", "4", "--mesh", "a=4,b=8", "--mapping", "a=gpu,b=node"],
     "--mapping a: axis size 4"),
    (["--topology", "dgx-h100", "--mesh", "tp=8", "--axes", "dp"], "--axes:"),
    (["--topology", "tpu-v5e", "--mesh", "x=4", "--no-nvls"], "--no-nvls:"),
    (["--topology", "dgx-h100", "--mesh", "tp=8", "--slice", "2x2"], "--slice:"),
    (["--topology", "dgx-h100", "--mesh", "tp"], "mesh:"),
])
def test_collective_input_errors_exit_2(capsys, argv, where):
    code, out, err = run(capsys, "collective", "all_reduce", "--bytes", "1MB", *argv)
    assert code == 2 and out == ""
    assert where in err and "Traceback" not in err


def test_malformed_profile_file_names_its_fields(capsys, tmp_path):
    data = load_profile("tpu-v5e").model_dump(mode="json")
    data["ici"]["link_bytes_per_s_oneway_achievable"] = -1
    del data["hbm_bytes"]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    code, _, err = run(capsys, "collective", "all_gather", "--topology", str(path), "--mesh", "x=4", "--bytes", "1MB")
    assert code == 2
    assert "--topology hbm_bytes: required field is missing" in err
    assert "--topology ici.link_bytes_per_s_oneway_achievable" in err
    path.write_text("[1, 2")
    code, _, err = run(capsys, "collective", "all_gather", "--topology", str(path), "--mesh", "x=4", "--bytes", "1MB")
    assert code == 2 and "cannot read profile file" in err


def test_unknown_kind_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["collective", "all-reduce", "--mesh", "tp=8", "--bytes", "1"])
    assert exit_.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
