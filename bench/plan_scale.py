"""The partitioned near-duplicate search at two sizes: every job run as its own process, as the workflow runs it.

Generates processed-part samples tables (keys as the workflow makes them, random 64-bit pHashes with 1% of the
samples planted copies 1-8 bits from another and a cluster of 10,000 samples with one placeholder hash), then
runs the jobs of rules/shards.smk through the same functions their scripts call: train_near_cells,
split_near_part per part, find_near_pairs per bucket, decide_near_duplicates. Records each job's peak RSS and
CPU time, recall on the planted pairs, and extrapolates each job kind to LAION-400M and LAION-5B with the
default sizes (part_size 250,000; dedupe.cell_samples, dedupe.bucket_samples).

    python bench/plan_scale.py --sizes 1000000 4000000 --out bench/results/plan-scale.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
PART_SIZE = 250_000
CLUSTER = 10_000


def generate(folder: Path, n: int, part_size: int, seed: int = 0) -> tuple[list[str], list[tuple[int, int, int]]]:
    """Samples tables of n samples; returns their paths and the planted pairs (original, copy, bits)."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 2**63, size=n, dtype=np.int64).astype(np.uint64) << np.uint64(1)
    codes |= rng.integers(0, 2, size=n).astype(np.uint64)
    planted = []
    originals = rng.choice(n // 2, size=n // 100, replace=False)
    copies = n // 2 + rng.choice(n // 2, size=n // 100, replace=False)
    for i, j in zip(originals, copies, strict=True):
        d = int(rng.integers(1, 9))
        flip = np.uint64(0)
        for b in rng.choice(64, d, replace=False):
            flip |= np.uint64(1) << np.uint64(int(b))
        codes[j] = codes[i] ^ flip
        planted.append((int(i), int(j), d))
    cluster = rng.choice(np.setdiff1d(np.arange(n), np.r_[originals, copies]), size=CLUSTER, replace=False)
    codes[cluster] = codes[cluster[0]]
    mirrors = rng.integers(0, 2**63, size=n, dtype=np.int64).astype(np.uint64)
    width = rng.integers(200, 2000, size=n)
    paths = []
    for p, start in enumerate(range(0, n, part_size)):
        sl = slice(start, min(n, start + part_size))
        df = pd.DataFrame(
            {
                "key": [f"{p:05d}{i:05d}" for i in range(sl.stop - sl.start)],
                "source_id": [f"https://example.invalid/{p}/{i}.jpg" for i in range(sl.stop - sl.start)],
                "width_before": width[sl], "height_before": 600, "bytes_before": width[sl] * 50,
                "phash": [f"{int(c):016x}" for c in codes[sl]], "phash_mirror": [f"{int(c):016x}" for c in mirrors[sl]],
            }
        )  # fmt: skip
        path = folder / f"web-{p:06d}.samples.parquet"
        df.to_parquet(path, index=False)
        paths.append(str(path))
    return paths, planted


def run_job(code: str) -> dict:
    """Run python code in a fresh process; its own peak RSS (MiB) and CPU seconds, as it reports them."""
    report = (
        "\nimport resource, json, sys; r = resource.getrusage(resource.RUSAGE_SELF)\n"
        "print('JOB ' + json.dumps([r.ru_maxrss, r.ru_utime + r.ru_stime]), file=sys.stderr)"
    )
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code + report], check=True, cwd=REPO, capture_output=True, text=True)
    rss, cpu = json.loads(proc.stderr.strip().splitlines()[-1].removeprefix("JOB "))
    return {"cpu_s": round(cpu, 2), "wall_s": round(time.perf_counter() - start, 2), "peak_mib": rss / 1024}


def measure(n: int, work: Path) -> dict:
    from shardsmith.shards.neardup import NearSettings

    work.mkdir(parents=True, exist_ok=True)
    paths, planted = generate(work, n, PART_SIZE)
    s = NearSettings(near="exclude")
    layout = s.layout(len(paths) * PART_SIZE)
    near = work / "near"
    (near / "entries").mkdir(parents=True, exist_ok=True)
    (near / "pairs").mkdir(parents=True, exist_ok=True)
    settings = json.dumps(vars(s))
    pre = f"import json; from shardsmith.shards.neardup import *; s = NearSettings(**json.loads({settings!r}))\n"
    jobs: dict[str, list[dict]] = {"train_near_cells": [], "split_near_part": [], "find_near_pairs": [], "decide": []}
    jobs["train_near_cells"].append(run_job(
        pre + f"train_near_cells({paths!r}, s, {len(paths) * PART_SIZE}, no_published(), [], "
        f"'{near}/cells.npz', '{near}/entries/published.arrow')"
    ))  # fmt: skip
    entries = []
    for p, path in enumerate(paths):
        out = f"{near}/entries/{p}.arrow"
        jobs["split_near_part"].append(
            run_job(pre + f"split_near_part_job({path!r}, {p}, [], None, '{near}/cells.npz', {out!r}, None)")
        )
        entries.append(out)
    entries.append(f"{near}/entries/published.arrow")
    for b in range(layout.buckets):
        code = (
            "from shardsmith.shards.nearparts import bucket_pairs, write_pairs\n"
            f"write_pairs('{near}/pairs/{b:05d}.parquet', bucket_pairs({entries!r}, {b}, 8, None, 20000, '{work}'))"
        )
        jobs["find_near_pairs"].append(run_job(code))
    pairs = [f"{near}/pairs/{b:05d}.parquet" for b in range(layout.buckets)]
    names = [Path(p).name.split(".")[0] for p in paths]
    jobs["decide"].append(run_job(
        pre + f"decide_near_duplicates({pairs!r}, {paths!r}, {names!r}, no_published(), s, {n}, '{near}')"
    ))  # fmt: skip
    found = pd.read_parquet(near / "near_duplicates.parquet")
    pair_rows = sum(len(pd.read_parquet(p, columns=["a"])) for p in pairs)
    got = set(zip(found["key"], found["kept_key"], strict=True)) | set(
        zip(found["kept_key"], found["key"], strict=True)
    )

    def key(i: int) -> str:
        return f"{i // PART_SIZE:05d}{i % PART_SIZE:05d}"

    # a planted pair counts as found when the copy or the original was left out for the other
    hit = {d: [0, 0] for d in range(1, 9)}
    left = set(found["key"])
    for i, j, d in planted:
        hit[d][1] += 1
        if (key(j), key(i)) in got or (key(i) in left and key(j) in left):
            hit[d][0] += 1
    low = [hit[d] for d in (1, 2, 3)]
    high = [hit[d] for d in range(4, 9)]
    return {
        "samples": n, "parts": len(paths), "cells": layout.cells, "buckets": layout.buckets, "pairs": pair_rows,
        "near_duplicates": len(found),
        "recall_1_3_bits": sum(h for h, _ in low) / max(1, sum(t for _, t in low)),
        "recall_4_8_bits": sum(h for h, _ in high) / max(1, sum(t for _, t in high)),
        "jobs": {k: {"count": len(v), "max_peak_mib": round(max(j["peak_mib"] for j in v), 1),
                     "max_cpu_s": max(j["cpu_s"] for j in v), "total_cpu_s": round(sum(j["cpu_s"] for j in v), 1)}
                 for k, v in jobs.items()},
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 4_000_000])
    ap.add_argument("--work", default=None, help="where the generated tables go (removed after)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="plan-scale-", dir=args.work))
    try:
        results = [measure(n, work / str(n)) for n in args.sizes]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = {"bench": "plan_scale", "part_size": PART_SIZE, "sizes": results}
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
