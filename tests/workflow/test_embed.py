"""The embedding stage inside the real workflow (snakemake on the generated demo, tiny random CLIP model).

One build: the parts are embedded first, a similarity threshold is taken from their scores (the median),
then the whole workflow runs with that threshold, as a user tightening `embed.min_similarity` would.
"""

import json
import os
import re
import subprocess
import sys
import tarfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # inherited by snakemake and its jobs: nothing is downloaded

import numpy as np
import pandas as pd
import pytest
import yaml
from workflow_helpers import REPO, demo_config, run_workflow, sha256

from shardsmith.cli.demo import make_demo
from shardsmith.cli.tinyclip import NAME, write_tiny_clip
from shardsmith.embed.stats import score_columns

pytestmark = pytest.mark.workflow
SIM = score_columns(NAME)["similarity"]


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    base = tmp_path_factory.mktemp("clipstage")
    make_demo(base / "data")
    model_config, ckpt = write_tiny_clip(base / "models")
    root = base / "build"
    embed = {
        "enabled": True, "model": NAME, "pretrained": str(ckpt), "model_config": str(model_config),
        "batch_size": 16, "workers": 1, "save_embeddings": True,
    }  # fmt: skip
    # parts of 32: the demo's 25 manifest rows in one part, 4 parts in all, each an embed_part job (the demo's
    # 16 makes 5; no test here counts parts)
    config = demo_config(base / "data", root, embed=embed, part_size=32)
    work = root / "work" / "demo"
    run_workflow(root, config, str(work / "plan" / "parts"))
    parts = sorted(p.name.removesuffix(".parquet") for p in (work / "plan" / "parts").glob("*.parquet"))
    run_workflow(root, config, *[str(work / "embed" / f"{p}.parquet") for p in parts])
    part_scores = pd.concat([pd.read_parquet(work / "embed" / f"{p}.parquet") for p in parts], ignore_index=True)
    threshold = round(float(np.median(part_scores[SIM])), 6)
    mtimes = {p: os.stat(work / "embed" / f"{p}.parquet").st_mtime_ns for p in parts}
    config = demo_config(base / "data", root, embed={**embed, "min_similarity": threshold}, part_size=32)
    run_workflow(root, config)
    return {"root": root, "config": config, "threshold": threshold, "part_scores": part_scores, "mtimes": mtimes}


def version_dir(root):
    base = root / "fast-storage" / "demo"
    return base / (base / "latest").read_text().strip()


def test_published_version_carries_embedding_stats_scores_and_embeddings(build):
    from open_clip_train.data import get_dataset_size

    published = version_dir(build["root"])
    sizes = json.loads((published / "sizes.json").read_text())
    stats = json.loads((published / "embedding_stats.json").read_text())
    marker = json.loads((published / "_COMPLETE.json").read_text())["files"]
    for shard, n in sizes.items():
        stem = shard.removesuffix(".tar")
        scores = pd.read_parquet(published / f"{stem}.scores.parquet")
        emb = np.load(published / f"{stem}.embeddings.npz")
        with tarfile.open(published / shard) as tar:
            keys = list(dict.fromkeys(m.name.split(".")[0] for m in tar.getmembers()))
        assert list(scores["key"]) == keys == list(emb["key"]) and len(keys) == n  # shard order, row for row
        assert emb["image"].shape == (n, 32) and emb["image"].dtype == np.float16
        for name in (f"{stem}.scores.parquet", f"{stem}.embeddings.npz"):
            assert marker[name]["sha256"] == sha256(published / name)
    assert stats["counts"]["published"] == sum(sizes.values()) == stats["similarity"]["n"]
    assert stats["random_weights"] is True and stats["provenance"]["weights_statement"].startswith("RANDOM WEIGHTS")
    assert stats["provenance"]["images_before_embedding"]["resize"]["max_side"] == build["config"]["resize"]["max_side"]
    assert marker["embedding_stats.json"]["sha256"] == sha256(published / "embedding_stats.json")
    pattern = str(published / f"demo-{{000000..{len(sizes) - 1:06d}}}.tar")  # extra files do not disturb OpenCLIP
    assert get_dataset_size(pattern) == (sum(sizes.values()), len(sizes))


def test_low_similarity_samples_land_in_the_ledger_and_shards_stay_uniform(build):
    published, threshold, config = version_dir(build["root"]), build["threshold"], build["config"]
    part_scores = build["part_scores"]
    low = set(part_scores.loc[part_scores[SIM] < threshold, "key"])
    rejected = pd.read_parquet(published / "rejected.parquet")
    ledger = rejected[rejected["reason"] == "low_similarity"]
    assert set(ledger["key"]) == low and 0 < len(low) < len(part_scores) and set(ledger["stage"]) == {"embed"}
    stats = json.loads((published / "stats.json").read_text())
    assert stats["published"] + stats["rejected"] == stats["input_records"]
    assert stats["rejected_by_reason"]["embed/low_similarity"] == len(low)
    sizes = [n for _, n in sorted(json.loads((published / "sizes.json").read_text()).items())]
    assert all(n == config["samples_per_shard"] for n in sizes[:-1]) and 0 < sizes[-1] <= config["samples_per_shard"]
    emb = json.loads((published / "embedding_stats.json").read_text())
    counts = emb["counts"]
    assert counts["excluded_low_similarity"] == len(low) and counts["embedded"] == len(part_scores)
    assert counts["embedded"] == counts["published"] + counts["excluded_low_similarity"] + counts["not_published_other"]
    assert emb["similarity"]["min"] >= threshold and emb["min_similarity"] == threshold


def test_a_new_threshold_re_embeds_nothing(build):
    work = build["root"] / "work" / "demo" / "embed"
    assert {p: os.stat(work / f"{p}.parquet").st_mtime_ns for p in build["mtimes"]} == build["mtimes"]


def _summary(root, config: dict, *python_flags: str) -> subprocess.CompletedProcess:
    """`snakemake --summary`: every file of the DAG (past the finished checkpoints), run without executing."""
    (root / "summary.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    cmd = [
        sys.executable, *python_flags, "-m", "snakemake", "--summary", "-s", str(REPO / "Snakefile"),
        "--directory", str(root), "--configfile", str(root / "summary.yaml"), "--workflow-profile", "none",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_disabled_embedding_schedules_no_embed_jobs_and_parse_imports_no_torch(build):
    root = build["root"]
    embed_files = re.compile(r"/embed/|\.scores\.parquet|\.embeddings\.npz|embedding_stats\.json")
    enabled = _summary(root, build["config"])
    assert embed_files.search(enabled.stdout)  # the check below can see embedding files when they are wanted
    disabled = _summary(root, {**build["config"], "embed": {"enabled": False}}, "-X", "importtime")
    assert "published/v1.json" in disabled.stdout and not embed_files.search(disabled.stdout)
    imported = {
        line.rsplit("|", 1)[-1].strip() for line in disabled.stderr.splitlines() if line.startswith("import time:")
    }
    assert "snakemake" in imported and "torch" not in imported and "open_clip" not in imported
