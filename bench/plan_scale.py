"""Planning at two sizes: the dataset-wide rules of rules/shards.smk run by Snakemake on generated parts.

Generates processed-part samples tables where download_part writes them (keys as the workflow makes them,
1% of them repeated across parts; random 64-bit pHashes with 1% of the samples planted copies 1-8 bits
from another and a cluster of 10,000 samples with one placeholder hash), a published version (`v0` in the
config's publish.dest) holding the image of 5% of the samples under other records, and the part plan; then
runs `snakemake` on the plan_shards checkpoint: fetch_published, split_published, split_lookups,
match_published and collect_published (records already published), split_keys and collect_dropped per group of
parts, split_exclusions, find_duplicate_keys and find_near_pairs per bucket, train_near_cells,
split_near_entries per group, decide_near_round per round and partition, decide_near_duplicates, plan_shards,
and the local list_* rules. Each job's peak memory and CPU come from the last line of its rule log
(shardsmith.core.logs); recall from the bucket jobs' pair files. Extrapolates each job kind to CC12M,
LAION-400M and LAION-5B with the default sizes (part_size 250,000; dedupe.cell_samples,
dedupe.bucket_samples): a job per group, bucket or partition keeps its size (its input is bucket_samples'
worth) but for what the probes add where a larger dataset has more (extrapolate), a job of the whole dataset
is fitted linearly in what it grows with. Also measured alone: plan_shards at thousands of parts
(measure_plan) and split_near_entries on one group at a few probe counts (measure_split).

    python bench/plan_scale.py --sizes 5000000 20000000 --out bench/results/plan-scale.json

A 20M run takes hours on 2 cores: with `--work DIR --resume` the runs stay in DIR/plan-scale, and the same
command run again after a stop goes on from the jobs that finished (sizes done are read back).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
SNAKEMAKE = Path(sys.executable).parent / "snakemake"
PART_SIZE = 250_000
CLUSTER = 10_000
PUBLISHED_SHARE = 20  # one sample in 20 has its image in the published version


def _key(i: np.ndarray, part_size: int) -> list[str]:
    return [f"{a:05d}{b:06d}" for a, b in zip((i // part_size).tolist(), (i % part_size).tolist(), strict=True)]


def _draw(n: int, seed: int):
    """The random hashes and which samples are planted copies of which, how many bits apart: the first draws
    of `generate`, so that planted_pairs gives its pairs without writing the tables."""
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 2**63, size=n, dtype=np.int64).astype(np.uint64) << np.uint64(1)
    codes |= rng.integers(0, 2, size=n).astype(np.uint64)
    originals = rng.choice(n // 2, size=n // 100, replace=False)
    copies = n // 2 + rng.choice(n // 2, size=n // 100, replace=False)
    bits = rng.integers(1, 9, size=len(originals))
    return rng, codes, originals, copies, bits


def planted_pairs(n: int, seed: int = 0) -> list[tuple[int, int, int]]:
    _, _, originals, copies, bits = _draw(n, seed)
    return list(zip(originals.tolist(), copies.tolist(), bits.tolist(), strict=True))


def generate(folder: Path, n: int, part_size: int, seed: int = 0) -> tuple[list[str], list[tuple[int, int, int]]]:
    """Samples tables of n samples in `folder` (web-NNNNNN.samples.parquet); returns their paths and the planted
    pairs (original, copy, bits). Built a part at a time: the strings of 20M samples at once would not fit."""
    rng, codes, originals, copies, bits = _draw(n, seed)
    flips = np.zeros(len(originals), np.uint64)
    for d in range(1, 9):  # d distinct bits for each pair planted d bits apart
        at = np.flatnonzero(bits == d)
        chosen = np.argsort(rng.random((len(at), 64)), axis=1)[:, :d].astype(np.uint64)
        flips[at] = np.bitwise_or.reduce(np.uint64(1) << chosen, axis=1) if len(at) else flips[at]
    codes[copies] = codes[originals] ^ flips
    planted = list(zip(originals.tolist(), copies.tolist(), bits.tolist(), strict=True))
    cluster = rng.choice(np.setdiff1d(np.arange(n), np.r_[originals, copies]), size=CLUSTER, replace=False)
    codes[cluster] = codes[cluster[0]]
    mirrors = rng.integers(0, 2**63, size=n, dtype=np.int64).astype(np.uint64)
    width = rng.integers(200, 2000, size=n)
    key_of = np.arange(n)
    repeat = rng.choice(n, size=n // 100, replace=False)  # 1% of the keys again, mostly in another part
    key_of[repeat] = rng.choice(n, size=len(repeat))
    paths = []
    folder.mkdir(parents=True, exist_ok=True)
    for p, start in enumerate(range(0, n, part_size)):
        sl = slice(start, min(n, start + part_size))
        rows = np.arange(sl.start, sl.stop)
        df = pd.DataFrame(
            {
                "key": _key(key_of[sl], part_size), "source": "web", "url": "",
                "source_id": [f"https://example.invalid/{p}/{i}.jpg" for i in range(sl.stop - sl.start)],
                "sha256": [f"{i:064x}" for i in rows.tolist()],
                "width_before": width[sl], "height_before": 600, "bytes_before": width[sl] * 50,
                "phash": [f"{int(c):016x}" for c in codes[sl]], "phash_mirror": [f"{int(c):016x}" for c in mirrors[sl]],
            }
        )  # fmt: skip
        path = folder / f"web-{p:06d}.samples.parquet"
        df.to_parquet(path, index=False)
        paths.append(str(path))
    return paths, planted


def publish_overlap(dest: Path, n: int, seed: int = 1) -> int:
    """A complete published version `v0` whose records hold the image (sha256) of every PUBLISHED_SHARE-th
    sample under another source_id: those samples are left out as already published."""
    rng = np.random.default_rng(seed)
    chosen = np.sort(rng.choice(n, size=n // PUBLISHED_SHARE, replace=False))
    m = len(chosen)
    hashes = rng.integers(0, 2**63, size=(m, 2), dtype=np.int64)
    version = dest / "bench" / "v0"
    version.mkdir(parents=True)
    pd.DataFrame(
        {
            "key": [f"old{i:09d}" for i in range(m)], "url": "",
            "source_id": [f"https://example.invalid/old/{i}.jpg" for i in range(m)],
            "sha256": [f"{i:064x}" for i in chosen.tolist()],
            "width_before": 800, "height_before": 600,
            "phash": [f"{int(c):016x}" for c in hashes[:, 0]], "phash_mirror": [f"{int(c):016x}" for c in hashes[:, 1]],
        }
    ).to_parquet(version / "manifest.parquet", index=False)  # fmt: skip
    digest = hashlib.sha256((version / "manifest.parquet").read_bytes()).hexdigest()
    marker = {"published_at": "2026-01-01T00:00:00Z", "files": {"manifest.parquet": {"sha256": digest}}}
    (version / "_COMPLETE.json").write_text(json.dumps(marker))
    (dest / "bench" / "latest").write_text("v0\n")
    return m


_RESOURCES = re.compile(r"^resources: peak_rss_mib=([\d.]+) child_peak_rss_mib=([\d.]+) cpu_s=([\d.]+)", re.M)


def job_figures(logs: Path) -> dict[str, list[dict]]:
    """Each job's peak memory and CPU from the last line of its rule log, by rule (the folder or file name)."""
    jobs: dict[str, list[dict]] = {}
    for log in sorted(logs.rglob("*.log")):
        got = _RESOURCES.findall(log.read_text(errors="replace"))
        if not got:
            continue  # the local list_* rules run inside snakemake: no job of their own
        peak, child, cpu = (float(x) for x in got[-1])
        rule = log.relative_to(logs).parts[0].removesuffix(".log")
        jobs.setdefault(rule, []).append({"peak_mib": max(peak, child), "cpu_s": cpu})
    return jobs


def prepare_run(root: Path, paths: list[str], settings: dict) -> None:
    """What a Snakemake run over generated samples tables needs beside them: the source manifest, the rest of
    download_part's outputs (not read by planning) and the part plan, all older than what planning writes,
    and root/config.yaml (a refresh's: publish.dest set) with `settings` added."""
    work = root / "work" / "bench"
    parts = [Path(p).name.split(".")[0] for p in paths]
    manifest = root / "manifests" / "web.parquet"
    manifest.parent.mkdir(parents=True)
    manifest.touch()
    for part in parts:
        for f in (root / "raw" / "bench" / f"{part}.tar", root / "raw" / "bench" / f"{part}.status.parquet",
                  work / "processed" / f"{part}.tar", work / "processed" / f"{part}.rejected.parquet",
                  work / "plan" / "parts" / f"{part}.parquet"):  # fmt: skip
            f.parent.mkdir(parents=True, exist_ok=True)
            f.touch()
    then = time.time() - 3600  # the manifest before the parts, the parts before anything planning writes
    os.utime(manifest, (then - 3600, then - 3600))
    for f in [*work.rglob("*"), *(root / "raw").rglob("*")]:
        os.utime(f, (then, then))
    config = {
        "dataset": "bench", "version": "v1",
        "paths": {k: str(root / k) for k in ("raw", "work", "output", "logs")},
        "sources": [{"name": "web", "type": "manifest", "path": str(manifest), "url_column": "url"}],
        "part_size": PART_SIZE, "dedupe": {"near": "exclude"}, "publish": {"dest": str(root / "fast-storage")},
        **settings,
    }  # fmt: skip
    (root / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))


def measure(n: int, root: Path, cores: int = 2, resume: bool = False) -> dict:
    """The planning rules of a workflow run by Snakemake over n generated samples (see the module). With
    `resume`, a root whose tables were generated (generated.json) is run on: Snakemake does the jobs left
    (a 20M run takes hours; stopped, it goes on from its finished jobs), and wall and CPU add up over runs."""
    work = root / "work" / "bench"
    ready, runs_file = root / "generated.json", root / "runs.json"
    if resume and ready.exists():
        planted = planted_pairs(n)
    else:
        if root.exists():
            shutil.rmtree(root)
        paths, planted = generate(work / "processed", n, PART_SIZE)
        publish_overlap(root / "fast-storage", n)
        prepare_run(root, paths, {"samples_per_shard": SAMPLES_PER_SHARD})
        ready.write_text(json.dumps({"samples": n}) + "\n")
    cmd = [str(SNAKEMAKE), str(work / "plan" / "shards"), "-s", str(REPO / "Snakefile"), "--directory", str(root),
           "--configfile", str(root / "config.yaml"), "--cores", str(cores), "--workflow-profile", "none",
           "--rerun-triggers", "mtime", "--rerun-incomplete", "--quiet", "rules"]  # fmt: skip
    subprocess.run([*cmd, "--unlock"], capture_output=True)  # a stopped run's lock
    probe = (  # snakemake's own and its jobs' CPU: every process it waited for
        "import resource, subprocess, sys, time; t = time.perf_counter();"
        "p = subprocess.run(sys.argv[2:], stdout=open(sys.argv[1], 'a'), stderr=subprocess.STDOUT);"
        "r = resource.getrusage(resource.RUSAGE_CHILDREN);"
        "print(p.returncode, time.perf_counter() - t, r.ru_utime + r.ru_stime)"
    )
    got = subprocess.run(
        [sys.executable, "-c", probe, str(root / "snakemake.out"), *cmd], capture_output=True, text=True
    )
    code, wall, cpu_all = got.stdout.split()
    runs = json.loads(runs_file.read_text()) if runs_file.exists() else []
    runs.append({"wall_s": float(wall), "cpu_s": float(cpu_all)})
    runs_file.write_text(json.dumps(runs) + "\n")
    if code != "0":
        raise RuntimeError(f"snakemake failed:\n{(root / 'snakemake.out').read_text()[-4000:]}")
    result = analyse(root, n, planted, sum(r["wall_s"] for r in runs), sum(r["cpu_s"] for r in runs))
    return {**result, "runs": len(runs)}


def analyse(root: Path, n: int, planted, wall: float | None = None, cpu_all: float | None = None) -> dict:
    """What a run of measure() left in `root`: each job's figures from its log, the pairs, recall and counts.
    `cpu_all`: snakemake's CPU and its jobs' together, where measured."""
    from shardsmith.shards.neardup import NearSettings

    plan = root / "work" / "bench" / "plan"
    jobs = job_figures(root / "logs" / "bench")
    parts = len(list((plan / "parts").glob("*.parquet")))
    layout = NearSettings(near="exclude").layout(parts * PART_SIZE)
    rounds = NearSettings(near="exclude").rounds_for(layout)
    ins = sorted(str(p) for p in (plan / "near" / "pairs" / "in").glob("*/*.arrow"))
    pending = sorted(str(p) for p in (plan / "near" / "rounds" / str(rounds) / "pending").glob("*/*.parquet"))
    pieces = sorted(str(p) for p in (plan / "dropped").glob("*/*.parquet"))  # a folder a job, a piece a group
    result = outcome(n, planted, ins, pending, pieces, plan / "near" / "near_duplicates.parquet", jobs)
    total_job_cpu = sum(j["cpu_s"] for v in jobs.values() for j in v)
    published = pd.read_parquet(root / "fast-storage" / "bench" / "v0" / "manifest.parquet", columns=["key"])
    result.update(
        parts=parts, groups=len(pieces), cells=layout.cells, probes=layout.probes,
        buckets=layout.buckets,
        shards=len(list((plan / "shards").glob("*.parts"))), decision_rounds=rounds, published_overlap=len(published),
        wall_s=round(wall, 1) if wall is not None else None,
        snakemake_cpu_s=round(cpu_all - total_job_cpu, 1) if cpu_all is not None else None,
    )  # fmt: skip
    return result


def outcome(n: int, planted, ins: list[str], pending: list[str], pieces: list[str], near_table: Path, jobs) -> dict:
    """Pairs, recall on the planted pairs, samples still waiting after the rounds, and each job kind's figures."""

    def read_in(path: str) -> pd.DataFrame:
        with pa.memory_map(path) as src:
            return pa.ipc.open_file(src).read_all().select(["u", "v"]).to_pandas()

    pair_table = pd.concat([read_in(p) for p in ins], ignore_index=True)
    pair_table = pd.DataFrame({"a": np.minimum(pair_table["u"], pair_table["v"]),
                               "b": np.maximum(pair_table["u"], pair_table["v"])}).drop_duplicates()  # fmt: skip
    waiting = sum(pd.read_parquet(p, columns=["v"])["v"].nunique() for p in pending)

    def ident(i: int) -> int:
        return ((i // PART_SIZE) << 32) | (i % PART_SIZE)

    got = set(zip(pair_table["a"].to_numpy().tolist(), pair_table["b"].to_numpy().tolist(), strict=True))
    dropped = set(pd.concat([pd.read_parquet(p, columns=["id"]) for p in pieces])["id"].tolist())
    hit = {d: [0, 0] for d in range(1, 9)}  # a planted pair counts as found when the search paired it
    for i, j, d in planted:
        if ident(i) in dropped or ident(j) in dropped:
            continue  # left out before the search (a repeated key, already published): not compared, rightly
        hit[d][1] += 1
        a, b = sorted((ident(i), ident(j)))
        hit[d][0] += (a, b) in got
    low = [hit[d] for d in (1, 2, 3)]
    high = [hit[d] for d in range(4, 9)]
    total_cpu = sum(j["cpu_s"] for v in jobs.values() for j in v)
    return {
        "samples": n, "pairs": len(pair_table), "waiting_after_rounds": waiting,
        "near_duplicates": len(pd.read_parquet(near_table, columns=["key"])),
        "recall_1_3_bits": sum(h for h, _ in low) / max(1, sum(t for _, t in low)),
        "recall_4_8_bits": sum(h for h, _ in high) / max(1, sum(t for _, t in high)),
        "cpu_us_per_sample": round(total_cpu / n * 1e6, 1),
        "jobs": {k: {"count": len(v), "max_peak_mib": round(max(j["peak_mib"] for j in v), 1),
                     "max_cpu_s": max(j["cpu_s"] for j in v), "total_cpu_s": round(sum(j["cpu_s"] for j in v), 1)}
                 for k, v in sorted(jobs.items())},
    }  # fmt: skip


TARGETS = {"CC12M": 12_400_000, "LAION-400M": 413_900_000, "LAION-5B": 5_850_000_000}
PER_PIECE = {"split_keys", "collect_dropped", "split_near_entries", "find_duplicate_keys", "find_near_pairs",
             "decide_near_round", "split_published", "split_lookups", "match_published",
             "collect_published"}  # fmt: skip


# What each whole-dataset job's CPU and memory grow with (fitted linearly through the two sizes), or "bounded":
# fetch_published copies the published manifests (bounded memory; bench/published_scale.py measures it);
# train_near_cells a strided sample and the published samples no longer in the build;
# split_exclusions holds one bucket of exclusion rows; decide_near_duplicates
# holds the samples still waiting after the rounds and a batch of each partition's table (its time: the samples
# left out, merged as a stream); plan_shards the list of shards.
MODEL = {
    "fetch_published": ("samples", "bounded"),
    "split_exclusions": ("samples", "bounded"),
    "train_near_cells": ("samples", "samples"),
    "decide_near_duplicates": ("near_duplicates", "bounded"),
    "plan_shards": ("shards", "shards"),
}
SAMPLES_PER_SHARD = 10_000


def nearest_us(cells: int) -> float:
    """CPU microseconds to find a hash's nearest cells at this cell count (bench/near_probes.py's figures, log-log
    between them, growing as the last two past the last)."""
    path = REPO / "bench" / "results" / "near-probes.json"
    if cells <= 1 or not path.exists():
        return 0.0
    rows = sorted((r["cells"], r["nearest_cpu_us_per_hash"]) for r in json.loads(path.read_text())["cells"])
    x, y = np.log([c for c, _ in rows]), np.log([u for _, u in rows])
    if math.log(cells) <= x[-1]:
        return float(np.exp(np.interp(math.log(cells), x, y)))
    return float(np.exp(y[-1] + (y[-1] - y[-2]) / (x[-1] - x[-2]) * (math.log(cells) - x[-1])))


def extrapolate(results: list[dict], n: int, plans: list[dict] = (), splits: list[dict] = ()) -> dict:
    """Each job kind at n samples: jobs per group or bucket as measured at the larger size (their input does not
    grow), whole-dataset jobs fitted linearly in what they grow with (MODEL). Pairs scale with the samples, as
    the planted ones do; chance pairs of unrelated hashes grow with the square (docs/near-duplicates.md).

    More probes at n than at the larger size: split_near_entries writes 4 + probes entries a hash (its memory
    and CPU grown as measure_split found them grow with the probes, else in proportion) and finds each hash's
    nearest cells among more of them (nearest_us); a
    find_near_pairs bucket reads as many entries, more of them cell entries (its CPU scaled by their share,
    as if the block entries cost nothing)."""
    from shardsmith.shards.layout import PlanLayout
    from shardsmith.shards.neardup import NearSettings

    small, large = results[0], results[-1]
    layout = NearSettings().layout(n)
    plan = PlanLayout.of(vars(NearSettings()), PART_SIZE, math.ceil(n / PART_SIZE))
    p_n, p_l = layout.probes, large.get("probes", 2)
    parts = math.ceil(n / PART_SIZE)
    groups = math.ceil(parts / max(1, NearSettings().bucket_samples // PART_SIZE))
    drivers = {"samples": n, "pairs": large["pairs"] / large["samples"] * n, "shards": n / SAMPLES_PER_SHARD,
               "near_duplicates": large["near_duplicates"] / large["samples"] * n}  # fmt: skip
    out = {
        "samples": n,
        "buckets": layout.buckets,
        "cells": layout.cells,
        "probes": layout.probes,
        "groups": groups,
        "pairs": round(drivers["pairs"]),
    }
    total_cpu: dict[str, float] = {}
    for kind, got in large["jobs"].items():
        if kind.startswith("list_"):  # local jobs that write a list of file names: a few bytes a file
            out[kind] = {"jobs": 1, "peak_mib": round(got["max_peak_mib"]), "cpu_min": round(got["max_cpu_s"] / 60, 1)}
            continue
        if kind in PER_PIECE:
            rounds, per_job = plan.rounds, plan.near_buckets.per_job
            count = {"find_duplicate_keys": plan.keys.units, "find_near_pairs": layout.buckets,
                     "match_published": plan.keys.units,
                     "decide_near_round": plan.near_buckets.count * rounds}.get(kind, groups)  # fmt: skip
            peak, cpu = got["max_peak_mib"], got["max_cpu_s"]
            if kind == "decide_near_round":  # a job decides per_job partitions one after another
                cpu *= per_job / min(per_job, large.get("buckets", per_job))
            if kind == "split_near_entries":
                extra = 2 * NearSettings().bucket_samples * (nearest_us(layout.cells) - nearest_us(large["cells"]))
                if len(splits) >= 2:  # measured alone at two probe counts: a line through them, from the run's
                    a, b = splits[0], splits[-1]
                    for key in ("peak_mib", "cpu_s"):
                        slope = (b[key] - a[key]) / (b["probes"] - a["probes"])
                        grown = max(0.0, slope) * (p_n - p_l)
                        peak, cpu = (peak + grown, cpu) if key == "peak_mib" else (peak, cpu + grown)
                else:
                    grow = (4 + p_n) / (4 + p_l)
                    peak, cpu = peak * grow, cpu * grow
                cpu += max(0.0, extra) / 1e6
            elif kind == "find_near_pairs":
                cpu *= (p_n / (4 + p_n)) / (p_l / (4 + p_l))
        else:
            count, was = 1, small["jobs"][kind]
            cpu_by, mem_by = MODEL[kind]

            def fit(a: float, b: float, by: str) -> float:
                x0, x1 = (small[by] if by != "samples" else small["samples"]), (large[by] if by != "samples" else n)
                x1 = large[by] if by != "samples" else large["samples"]
                slope = (b - a) / (x1 - x0) if x1 != x0 else 0.0
                return b + max(0.0, slope) * (drivers[by] - x1)

            cpu = fit(was["max_cpu_s"], got["max_cpu_s"], cpu_by)
            peak = got["max_peak_mib"] if mem_by == "bounded" else fit(was["max_peak_mib"], got["max_peak_mib"], mem_by)
        out[kind] = {"jobs": count, "peak_mib": round(peak), "cpu_min": round(cpu / 60, 1)}
        mean = got["total_cpu_s"] / got["count"] / got["max_cpu_s"] if kind in PER_PIECE and got["max_cpu_s"] else 1
        total_cpu[kind] = count * cpu * mean  # the pieces' mean, not their largest
    shards = n / SAMPLES_PER_SHARD
    if len(plans) >= 2:  # plan_shards measured alone at thousands of parts; below the first, that one's figures
        a, b = plans[0], plans[-1]

        def line(key: str) -> float:
            slope = (b[key] - a[key]) / (b["shards"] - a["shards"])
            return a[key] if shards <= a["shards"] else b[key] + max(0.0, slope) * (shards - b["shards"])

        cpu_min = round(line("cpu_s") / 60, 1)
        out["plan_shards"] = {"jobs": 1, "peak_mib": round(line("peak_mib")), "cpu_min": cpu_min}
        total_cpu["plan_shards"] = line("cpu_s")
    # every job's CPU (its count times its CPU, unrounded) over the samples: the target's measure
    out["cpu_us_per_sample"] = round(sum(total_cpu.values()) / n * 1e6, 1)
    out["cpu_us_per_sample_by_job"] = {k: round(v / n * 1e6, 1) for k, v in sorted(total_cpu.items()) if v / n > 5e-7}
    return out


def measure_plan(parts: int, work: Path) -> dict:
    """plan_shards alone at LAION scale: `parts` parts of PART_SIZE samples (ledger pieces holding only their
    counts, a group of two parts each, and the near-duplicates' piece over all of them), SAMPLES_PER_SHARD a
    shard. Its peak memory and CPU, measured where the sizes above only allow a fit."""
    from shardsmith.shards.buckets import LEDGER_PIECE, write_ledger_piece

    work.mkdir(parents=True, exist_ok=True)
    names = [f"ds-{p:06d}" for p in range(parts)]
    pieces = []
    for g in range(0, parts, 2):
        pieces.append(str(work / f"{g}.parquet"))
        write_ledger_piece(
            pieces[-1], pd.DataFrame(columns=LEDGER_PIECE), {n: [PART_SIZE, 0] for n in names[g : g + 2]}
        )
    pieces.append(str(work / "near.parquet"))
    write_ledger_piece(pieces[-1], pd.DataFrame(columns=LEDGER_PIECE), {n: [0, 0] for n in names})
    (work / "plan").mkdir()
    log = work / "plan_shards.log"
    code = (
        "from shardsmith.core.logs import run_job; from shardsmith.shards.plan import plan_shards\n"
        "from shardsmith.shards.neardup import NearSettings\n"
        f"run_job({str(log)!r}, lambda: plan_shards({pieces!r}, '{work / 'plan'}', dataset='ds', "
        f"samples_per_shard={SAMPLES_PER_SHARD}, near=NearSettings(), found=None, log=lambda m: None))"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
    peak, _, cpu = (float(x) for x in _RESOURCES.findall(log.read_text())[-1])
    got = {"peak_mib": peak, "cpu_s": cpu}
    return {"parts": parts, "shards": parts * PART_SIZE // SAMPLES_PER_SHARD, **got}


def measure_split(probes: int, work: Path) -> dict:
    """split_near_entries alone on one group (bucket_samples' worth of generated samples) with its hashes going to
    `probes` cells (64 cells at least: the cell count changes the nearest-cell search, which nearest_us covers,
    not the entries): peak memory and CPU as the rule's log reports them, and the entries file's size."""
    from shardsmith.shards.neardup import NearSettings

    samples = NearSettings().bucket_samples
    paths, _ = generate(work / "parts", samples, PART_SIZE)
    log = work / "split_near_entries.log"
    code = (
        "import numpy as np\n"
        "from shardsmith.core.logs import run_job\n"
        "from shardsmith.shards.neardup import NearSettings, split_near_entries, train_near_cells\n"
        "from shardsmith.shards.nearparts import Layout\n"
        f"w, paths = {str(work)!r}, {paths!r}\n"
        f"layout = Layout(cells=max(64, 4 * {probes}), buckets=16, probes={probes})\n"
        f"train_near_cells(paths, NearSettings(), {samples}, [], w + '/cells.npz', layout)\n"
        f"run_job({str(log)!r}, lambda: split_near_entries(paths, 0, [np.empty(0, np.int64)] * len(paths), None,\n"
        "        w + '/cells.npz', w + '/e.arrow', w + '/h.arrow', []))\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
    peak, _, cpu = (float(x) for x in _RESOURCES.findall(log.read_text())[-1])
    entries = (work / "e.arrow").stat().st_size
    shutil.rmtree(work, ignore_errors=True)
    return {"probes": probes, "samples": samples, "peak_mib": peak, "cpu_s": cpu, "entries_mib": round(entries / 2**20)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 4_000_000])
    ap.add_argument("--work", default=None, help="where the generated tables go (removed after)")
    ap.add_argument("--plan-parts", type=int, nargs="*", default=[1000, 4000],
                    help="plan_shards alone at these part counts (measure_plan)")  # fmt: skip
    ap.add_argument("--split-probes", type=int, nargs="*", default=[4, 26],
                    help="split_near_entries alone on one group at these probes (measure_split)")  # fmt: skip
    ap.add_argument("--out", default=None)
    ap.add_argument("--resume", action="store_true",
                    help="keep the runs in WORK/plan-scale and go on from where a stopped bench left them")  # fmt: skip
    args = ap.parse_args()
    if args.resume and not args.work:
        ap.error("--resume needs --work (the folder the runs are kept in)")
    work = (
        Path(args.work) / "plan-scale" if args.resume else Path(tempfile.mkdtemp(prefix="plan-scale-", dir=args.work))
    )
    work.mkdir(parents=True, exist_ok=True)
    try:
        results = [sized(n, work, args.resume) for n in args.sizes]
        plans = [measure_plan(p, work / f"plan-{p}") for p in args.plan_parts]
        splits = [measure_split(p, work / f"split-{p}") for p in args.split_probes]
    except BaseException:
        if not args.resume:
            shutil.rmtree(work, ignore_errors=True)
        raise
    shutil.rmtree(work, ignore_errors=True)
    extrapolated = {name: extrapolate(results, n, plans, splits) for name, n in TARGETS.items()}
    report = {"bench": "plan_scale", "part_size": PART_SIZE, "sizes": results, "plan_shards_alone": plans,
              "split_near_entries_alone": splits, "extrapolated": extrapolated}  # fmt: skip
    write_report(report, args.out)


def sized(n: int, work: Path, resume: bool) -> dict:
    """measure() at n; with `resume`, its result is kept beside the run and read back by a resumed bench."""
    done = work / f"{n}.json"
    if resume and done.exists():
        return json.loads(done.read_text())
    result = measure(n, work / str(n), resume=resume)
    if resume:
        done.write_text(json.dumps(result) + "\n")
        shutil.rmtree(work / str(n), ignore_errors=True)  # its tables: tens of GB at 20M
    return result


def write_report(report: dict, out: str | None) -> None:
    """The results as JSON on stdout, and in `out` when given."""
    text = json.dumps(report, indent=1)
    print(text)
    if out:
        Path(out).write_text(text + "\n")


if __name__ == "__main__":
    main()
