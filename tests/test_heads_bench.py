"""bench/heads_bench.py: a short run on the CPU with the tiny model, its results file and what it states."""

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

import bench.heads_bench as hb
from shardsmith.cli.tinyclip import NAME


def test_a_short_run_measures_the_heads_against_the_pass_and_embed_part(tmp_path):
    out = tmp_path / "heads.json"
    result = hb.main(
        ["--models", NAME, "--device", "cpu", "--batch", "4", "--count", "6", "--rounds", "1", "--threads", "1",
         "--data", str(tmp_path / "data"), "--out", str(out)]
    )  # fmt: skip
    assert json.loads(out.read_text()) == result and result["device"] == "cpu"
    entry = result["models"][NAME]
    forward = entry["forward"]
    assert forward["embed_dim"] == 32 and forward["heads_alone_ms_per_sample"] > 0
    share = forward["heads_alone_ms_per_sample"] / forward["forward_ms_per_sample_without_heads"]
    assert forward["heads_alone_fraction_of_the_pass"] == pytest.approx(share, rel=0.05, abs=1e-4)
    run = entry["end_to_end"]
    assert run["samples"] == 6 and len(run["runs"]["with"]) == 1 and run["ratio"] > 0
    assert entry["meets_target"] == (forward["heads_alone_fraction_of_the_pass"] < hb.TARGET)
