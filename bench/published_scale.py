"""A refresh's lookup of records already published, at two sizes: the partitioned jobs run by Snakemake.

The build is bench/plan_scale.py's generated parts (n samples, parts of 250,000). The published version `v0`
is the previous build of a refresh: 95% of the samples under their source_id (old records, their images
the same), a quarter of the rest's images (sha256) under other records (so 1.25% of the samples are left
out as already published), and 5% x n records gone from the build, with pHashes. Snakemake runs
fetch_published, split_published and split_lookups per group, match_published per bucket and
collect_published per group (rules/shards.smk; split_near_entries then enters each group's gone records) with
the default sizes; each job's peak memory and CPU come from the last line of its rule log. The counts are
checked: every old record found, every planted exclusion made, every gone record listed. Each job kind is
extrapolated to CC12M, LAION-400M and LAION-5B: a job per group or bucket reads a group's or a bucket's share
whatever the dataset's size, so it stays as measured at the larger size; fetch_published copies the
manifests: its CPU is fitted in their bytes.

    python bench/published_scale.py --sizes 1000000 4000000 --out bench/results/published-scale.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plan_scale import PART_SIZE, REPO, SNAKEMAKE, TARGETS, generate, job_figures, prepare_run, write_report

sys.path.insert(0, str(REPO))
from shardsmith.shards.neardup import NearSettings

OLD_SHARE, REPEATED_SHARE, GONE_SHARE = 0.95, 0.25, 0.05
PER_PIECE = ["split_published", "split_lookups", "match_published", "collect_published"]


def publish_previous(dest: Path, paths: list[str], seed: int = 2) -> dict:
    """`v0`, written a part at a time (a row group each): old records, other records holding some new
    samples' images, and records gone from the build. Returns what a correct lookup must find."""
    rng = np.random.default_rng(seed)
    version = dest / "bench" / "v0"
    version.mkdir(parents=True)
    path = version / "manifest.parquet"
    want = {"old": 0, "excluded": 0, "gone": 0, "records": 0}
    cols = ["key", "source_id", "url", "sha256", "width_before", "height_before", "phash", "phash_mirror"]
    writer = None
    for p, sample_path in enumerate(paths):
        t = pd.read_parquet(sample_path, columns=cols)
        old = rng.random(len(t)) < OLD_SHARE
        repeated = ~old & (rng.random(len(t)) < REPEATED_SHARE)
        gone_n = int(len(t) * GONE_SHARE)
        gone_codes = rng.integers(0, 2**63, size=(gone_n, 2), dtype=np.int64)
        frames = [
            t[old].assign(key=lambda d: "old" + d["key"]),
            t[repeated].assign(key=lambda d: "rep" + d["key"], source_id=lambda d: "elsewhere:" + d["source_id"]),
            pd.DataFrame({
                "key": [f"gone{p:05d}{i:07d}" for i in range(gone_n)], "url": "",
                "source_id": [f"https://example.invalid/gone/{p}/{i}.jpg" for i in range(gone_n)],
                "sha256": [f"g{p:05d}{i:058d}" for i in range(gone_n)], "width_before": 640, "height_before": 480,
                "phash": [f"{int(c):016x}" for c in gone_codes[:, 0]],
                "phash_mirror": [f"{int(c):016x}" for c in gone_codes[:, 1]],
            }),
        ]  # fmt: skip
        table = pa.Table.from_pandas(pd.concat(frames, ignore_index=True)[cols], preserve_index=False)
        if writer is None:
            writer = pq.ParquetWriter(path, table.schema)
        writer.write_table(table)
        want["old"] += int(old.sum())
        want["excluded"] += int(repeated.sum())
        want["gone"] += gone_n + int(repeated.sum())  # the other records holding new images are not in the build
        want["records"] += table.num_rows
    writer.close()
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    marker = {"published_at": "2026-01-01T00:00:00Z", "files": {"manifest.parquet": {"sha256": digest}}}
    (version / "_COMPLETE.json").write_text(json.dumps(marker))
    (dest / "bench" / "latest").write_text("v0\n")
    want["manifest_bytes"] = path.stat().st_size
    return want


def measure(n: int, root: Path, cores: int = 2) -> dict:
    if root.exists():
        shutil.rmtree(root)
    work = root / "work" / "bench"
    paths, _ = generate(work / "processed", n, PART_SIZE)
    want = publish_previous(root / "fast-storage", paths)
    prepare_run(root, paths, {})
    parts = [Path(p).name.split(".")[0] for p in paths]
    layout = NearSettings(near="exclude").layout(len(parts) * PART_SIZE)
    per_group = max(1, NearSettings().bucket_samples // PART_SIZE)
    groups = math.ceil(len(parts) / per_group)
    plan = work / "plan" / "published"
    targets = [str(plan / k / f"{g:05d}.parquet") for g in range(groups) for k in ("old", "already_published", "gone")]
    cmd = [str(SNAKEMAKE), *targets, "-s", str(REPO / "Snakefile"), "--directory", str(root),
           "--configfile", str(root / "config.yaml"), "--cores", str(cores), "--workflow-profile", "none",
           "--rerun-triggers", "mtime", "--quiet", "rules"]  # fmt: skip
    start = time.perf_counter()
    with open(root / "snakemake.out", "w") as out:
        code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode
    wall = time.perf_counter() - start
    if code != 0:
        raise RuntimeError(f"snakemake failed:\n{(root / 'snakemake.out').read_text()[-4000:]}")
    got = {
        "old": sum(len(pd.read_parquet(p)) for p in (plan / "old").glob("*.parquet")),
        "excluded": sum(len(pd.read_parquet(p)) for p in (plan / "already_published").glob("*.parquet")),
        "gone": sum(len(pd.read_parquet(p)) for p in (plan / "gone").glob("*.parquet")),
    }
    for k, v in got.items():
        if v != want[k]:
            raise RuntimeError(f"{k}: {v} found, {want[k]} planted")
    jobs = job_figures(root / "logs" / "bench")
    return {
        "samples": n, "parts": len(parts), "groups": groups, "buckets": layout.buckets,
        "published_records": want["records"], "manifest_bytes": want["manifest_bytes"], **got,
        "wall_s": round(wall, 1),
        "cpu_us_per_sample": round(sum(j["cpu_s"] for k in jobs for j in jobs[k]) / n * 1e6, 1),
        "jobs": {k: {"count": len(v), "max_peak_mib": round(max(j["peak_mib"] for j in v), 1),
                     "max_cpu_s": max(j["cpu_s"] for j in v), "total_cpu_s": round(sum(j["cpu_s"] for j in v), 1)}
                 for k, v in sorted(jobs.items())},
    }  # fmt: skip


def extrapolate(results: list[dict], n: int) -> dict:
    """Jobs per group or bucket as at the larger size (a group's or bucket's share does not grow: buckets grow
    at least as the samples do); fetch_published's copy in proportion to the manifest's bytes."""
    large = results[-1]
    layout = NearSettings(near="exclude").layout(math.ceil(n / PART_SIZE) * PART_SIZE)
    per_group = max(1, NearSettings().bucket_samples // PART_SIZE)
    out = {"samples": n, "groups": math.ceil(n / PART_SIZE / per_group), "buckets": layout.buckets, "jobs": {}}
    for kind in PER_PIECE:
        j = large["jobs"][kind]
        share = 1.0
        if kind == "match_published":  # a bucket's share of the lookups
            share = (n / layout.buckets) / (large["samples"] / large["buckets"])
        out["jobs"][kind] = {"peak_gib": round(j["max_peak_mib"] * max(1.0, share) / 1024, 2),
                             "cpu_min": round(j["max_cpu_s"] * max(1.0, share) / 60, 1)}  # fmt: skip
    # fetch_published: CPU fitted linearly in the manifest's bytes through the two sizes (start-up included)
    small, scale = results[0], n / large["samples"]
    cpu = [r["jobs"]["fetch_published"]["max_cpu_s"] for r in (small, large)]
    size = [r["manifest_bytes"] for r in (small, large)]
    per_byte = (cpu[1] - cpu[0]) / (size[1] - size[0]) if size[1] > size[0] else cpu[1] / size[1]
    out["jobs"]["fetch_published"] = {
        "peak_gib": round(large["jobs"]["fetch_published"]["max_peak_mib"] / 1024, 2),
        "cpu_min": round((cpu[1] + per_byte * (size[1] * scale - size[1])) / 60, 1),
        "manifest_gib": round(size[1] * scale / 2**30, 1),
    }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 4_000_000])
    ap.add_argument("--work", default=None, help="where the generated tables go (removed after)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="published-scale-", dir=args.work))
    try:
        results = [measure(n, work / str(n)) for n in args.sizes]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = {
        "bench": "published_scale", "part_size": PART_SIZE, "sizes": results,
        "extrapolated": {name: extrapolate(results, n) for name, n in TARGETS.items()},
    }  # fmt: skip
    write_report(report, args.out)


if __name__ == "__main__":
    main()
