"""`benchmarks/published_runs.py`: published training runs priced with nothing fitted to them.
Its predictions do not move when the measured step times are scrambled, a row's error names its
line and column, and `--json` gives each row's fields with the prediction."""

from __future__ import annotations

import csv
import importlib.util
import json
import random
import sys
from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path

import pytest

from autoshard.errors import InputError

SCRIPT = Path(__file__).parent.parent / "benchmarks" / "published_runs.py"
spec = importlib.util.spec_from_file_location("published_runs", SCRIPT)
published_runs = sys.modules["published_runs"] = importlib.util.module_from_spec(spec)  # its dataclasses look it up
spec.loader.exec_module(published_runs)

ROWS = "megatron-22B"  # the two rows without a pipeline: seconds to price


def rows_of(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def write_rows(path: Path, rows: list[dict[str, str]]) -> Path:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def predictions(path: Path) -> list[dict]:
    out = StringIO()
    with redirect_stdout(out):
        assert published_runs.main(["--csv", str(path), "--json", "--only", ROWS, "--time-limit", "5"]) == 0
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_scrambled_measurements_leave_the_predictions_where_they_were(tmp_path):
    rows = rows_of(published_runs.CSV)
    measured = [row["measured_s_per_step"] for row in rows]
    scrambled = [dict(row, measured_s_per_step=str(float(m) * random.Random(i).uniform(0.5, 2)))
                 for i, (row, m) in enumerate(zip(rows, measured[::-1]))]
    before = predictions(published_runs.CSV)
    published_runs._PRICES.clear()  # priced again from scratch, not from the layouts' cache
    after = predictions(write_rows(tmp_path / "scrambled.csv", scrambled))
    assert len(before) == 2 and [b["measured_s_per_step"] for b in before] != [a["measured_s_per_step"] for a in after]
    for b, a in zip(before, after):
        assert (a["predicted_s_per_step"], a["predicted_memory_bytes_per_gpu"]) == \
            (b["predicted_s_per_step"], b["predicted_memory_bytes_per_gpu"])
        assert b["model"] == ROWS and b["predicted_memory_bytes_per_gpu"] < 80e9
        # at least the model's FLOPs at the chips' peak: 6 per parameter and token, 8 with full recomputation
        flops = (8 if b["recompute"] == "full" else 6) * 22e9 * b["global_batch"] * b["seq"]
        assert b["predicted_s_per_step"] > flops / (b["gpus"] * 312e12)


def test_a_row_that_cannot_be_priced_is_named_by_its_line_and_column(tmp_path):
    rows = rows_of(published_runs.CSV)
    bad = [dict(rows[0], gpu="Z100"), dict(rows[1], tp="3")]
    with pytest.raises(InputError) as raised:
        published_runs.read_runs(write_rows(tmp_path / "bad.csv", bad))
    messages = [str(p) for p in raised.value.problems]
    assert any("bad.csv:2 gpu" in m and "Z100" in m for m in messages), messages
    with pytest.raises(InputError) as raised:
        published_runs.read_runs(write_rows(tmp_path / "bad.csv", bad[1:]))
    assert any("bad.csv:2 gpus" in str(p) and "tp x pp x dp = 3" in str(p) for p in raised.value.problems)


def test_a_data_parallel_pipelined_row_is_priced_with_its_batch_over_the_replicas(tmp_path):
    row = {"model": "small", "layers": "6", "hidden": "512", "heads": "8", "seq": "256", "vocab": "1024", "gpus": "16",
           "gpu": "H100-80GB", "tp": "4", "pp": "2", "dp": "2", "interleave": "1", "global_batch": "16",
           "micro_batch": "2", "recompute": "selective", "seq_parallel": "yes", "measured_s_per_step": ""}
    (run,) = published_runs.read_runs(write_rows(tmp_path / "small.csv", [row]))
    replicated = published_runs.predict(run, time_limit_s=5)
    one_replica = published_runs.predict(published_runs.Run(**{**run.__dict__, "dp": 1, "gpus": 8, "global_batch": 8}),
                                   time_limit_s=5)
    # each replica runs the same microbatches; the replicated step adds the gradients' reduction over dp
    assert replicated.step_s > one_replica.step_s > 0 and 0 < replicated.bubble_fraction < 1


def test_the_layout_search_covers_the_published_degrees_and_ranks_a_small_cluster(tmp_path):
    for run in published_runs.read_runs(published_runs.CSV):
        degrees = {(c.tp, c.pp, c.dp, c.interleave, c.micro_batch, c.recompute) for c in published_runs.layouts(run)}
        assert (run.tp, run.pp, run.dp, run.interleave, run.micro_batch, run.recompute) in degrees
    # on a small cluster every layout is priced: the fitting ones, fastest first
    row = {"model": "small", "layers": "2", "hidden": "256", "heads": "8", "seq": "128", "vocab": "512", "gpus": "4",
           "gpu": "H100-80GB", "tp": "2", "pp": "2", "dp": "1", "interleave": "1", "global_batch": "4",
           "micro_batch": "2", "recompute": "selective", "seq_parallel": "yes", "measured_s_per_step": ""}
    [run] = published_runs.read_runs(write_rows(tmp_path / "small.csv", [row]))
    ranked = published_runs.search(run, 2.0)
    assert ranked and [p.step_s for _, p in ranked] == sorted(p.step_s for _, p in ranked)
    assert all(c.tp * c.pp * c.dp == 4 and 4 % (c.dp * c.micro_batch) == 0 for c, _ in ranked)
    assert all(p.memory_bytes_per_gpu <= 80e9 for _, p in ranked)
