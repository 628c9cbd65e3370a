"""Planning at two sizes: every dataset-wide job run as its own process, as the workflow runs it.

Generates processed-part samples tables (keys as the workflow makes them, 1% of them repeated across parts, an
exclusion table naming 5% of them, random 64-bit pHashes with 1% of the samples planted copies 1-8 bits from
another and a cluster of 10,000 samples with one placeholder hash), then runs the jobs of rules/shards.smk
through the same functions their scripts call: split_keys and collect_dropped per group of parts,
split_exclusions, find_duplicate_keys and find_near_pairs per bucket, train_near_cells, split_near_entries per
group, decide_near_round per round and partition, decide_near_duplicates, plan_shards. Records each job's peak
RSS and CPU time and the recall on the planted pairs, and extrapolates each job kind to LAION-400M and
LAION-5B with the default sizes (part_size 250,000; dedupe.cell_samples, dedupe.bucket_samples): a job per
group, bucket or partition keeps its size (its input is bucket_samples' worth), a job of the whole dataset is
fitted linearly in what it grows with.

    python bench/plan_scale.py --sizes 1000000 4000000 --out bench/results/plan-scale.json
"""

from __future__ import annotations

import argparse
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
    keys = np.array([f"{i // part_size:05d}{i % part_size:06d}" for i in range(n)], dtype=object)
    repeat = rng.choice(n, size=n // 100, replace=False)  # 1% of the keys again, mostly in another part
    keys[repeat] = keys[rng.choice(n, size=len(repeat))]
    paths = []
    for p, start in enumerate(range(0, n, part_size)):
        sl = slice(start, min(n, start + part_size))
        df = pd.DataFrame(
            {
                "key": keys[sl], "source": "web", "url": "",
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
    # VmHWM, not ru_maxrss: Linux keeps ru_maxrss across exec, so a child would report the bench's own peak
    report = (
        "\nimport resource, json, re, sys; r = resource.getrusage(resource.RUSAGE_SELF)\n"
        "hwm = int(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1))\n"
        "print('JOB ' + json.dumps([hwm, r.ru_utime + r.ru_stime]), file=sys.stderr)"
    )
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code + report], check=True, cwd=REPO, capture_output=True, text=True)
    rss, cpu = json.loads(proc.stderr.strip().splitlines()[-1].removeprefix("JOB "))
    return {"cpu_s": round(cpu, 2), "wall_s": round(time.perf_counter() - start, 2), "peak_mib": rss / 1024}


def measure(n: int, work: Path) -> dict:
    """Every planning job of rules/shards.smk, each in its own process, in the workflow's order."""
    from shardsmith.shards.neardup import NearSettings

    work.mkdir(parents=True, exist_ok=True)
    paths, planted = generate(work, n, PART_SIZE)
    names = [Path(p).name.split(".")[0] for p in paths]
    s = NearSettings(near="exclude")
    layout = s.layout(len(paths) * PART_SIZE)
    k = max(1, s.bucket_samples // PART_SIZE)  # parts per group, as rules/common.smk
    groups = [list(range(g, min(len(paths), g + k))) for g in range(0, len(paths), k)]
    excluded = work / "already_published.parquet"  # 5% of the keys, as a refresh's exclusion table
    rng = np.random.default_rng(1)
    keys = pd.concat([pd.read_parquet(p, columns=["key"]) for p in paths])["key"].to_numpy()
    pd.DataFrame({"key": rng.choice(keys, size=n // 20, replace=False), "stage": "dedupe",
                  "reason": "already_published", "detail": "url already published"}).to_parquet(excluded)  # fmt: skip
    w = {d: work / d for d in ("keys", "drops", "dropped", "near", "pairs", "plan")}
    for d in w.values():
        d.mkdir(parents=True, exist_ok=True)
    settings = json.dumps(vars(s))
    pre = (
        "import json; from shardsmith.shards.neardup import *; from shardsmith.shards.nearparts import *\n"
        "from shardsmith.shards.buckets import *; from shardsmith.shards.plan import *\n"
        f"s = NearSettings(**json.loads({settings!r}))\n"
    )
    jobs: dict[str, list[dict]] = {}

    def job(kind: str, code: str) -> None:
        jobs.setdefault(kind, []).append(run_job(pre + code))

    for g, members in enumerate(groups):
        job(
            "split_keys",
            f"split_keys({[paths[i] for i in members]!r}, {members[0]}, {layout.buckets}, '{w['keys']}/{g}.arrow')",
        )
    job(
        "split_exclusions",
        f"split_exclusions([{str(excluded)!r}], {layout.buckets}, '{w['keys']}/excluded.arrow', '{work}')",
    )
    key_files = [f"{w['keys']}/{g}.arrow" for g in range(len(groups))]
    drops = [f"{w['drops']}/{b}.arrow" for b in range(layout.buckets)]
    for b, out in enumerate(drops):
        job("find_duplicate_keys", f"bucket_drops({key_files!r}, '{w['keys']}/excluded.arrow', {b}, {k}, {out!r})")
    pieces = [f"{w['dropped']}/{g}.parquet" for g in range(len(groups))]
    for g, members in enumerate(groups):
        job("collect_dropped", f"group_drops({drops!r}, {g}, {[paths[i] for i in members]!r}, "
                               f"{[names[i] for i in members]!r}, {members[0]}, {pieces[g]!r})")  # fmt: skip
    job("train_near_cells", f"train_near_cells({paths!r}, s, {len(paths) * PART_SIZE}, no_published(), [], "
                            f"'{w['near']}/cells.npz', '{w['near']}/published.arrow', "
                            f"'{w['near']}/published.homes')")  # fmt: skip
    entries = [f"{w['near']}/{g}.arrow" for g in range(len(groups))]
    homes = [f"{w['near']}/{g}.homes" for g in range(len(groups))]
    for g, members in enumerate(groups):
        job("split_near_entries", f"dropped = [dropped_ids([{pieces[g]!r}], p) & 0xFFFFFFFF for p in {members!r}]\n"
                                  f"split_near_group({[paths[i] for i in members]!r}, {members[0]}, dropped, None, "
                                  f"'{w['near']}/cells.npz', {entries[g]!r}, {homes[g]!r}, [])")  # fmt: skip
    entries.append(f"{w['near']}/published.arrow")
    homes.append(f"{w['near']}/published.homes")
    ins = [f"{w['pairs']}/{b}.in.arrow" for b in range(layout.buckets)]
    outs = [f"{w['pairs']}/{b}.out.arrow" for b in range(layout.buckets)]
    for b in range(layout.buckets):
        job("find_near_pairs", f"write_pairs({ins[b]!r}, {outs[b]!r}, bucket_pairs({entries!r}, {b}, 8, None, 20000, "
                               f"'{work}'), {layout.buckets})")  # fmt: skip
    messages: list[str] = []
    rounds = s.rounds_for(layout)
    for r in range(1, rounds + 1):
        sent = [f"{w['pairs']}/r{r}.{p}.messages" for p in range(layout.buckets)]
        for p in range(layout.buckets):
            job("decide_near_round", f"from shardsmith.shards.neardecide import decide_round\n"
                                     f"decide_round({ins!r}, {outs!r}, {homes!r}, {messages!r}, {p}, {layout.buckets}, "
                                     f"{sent[p]!r}, '{w['pairs']}/{p}.found', '{w['pairs']}/{p}.pending')")  # fmt: skip
        messages = sent
    found = [f"{w['pairs']}/{p}.found" for p in range(layout.buckets)]
    pending = [f"{w['pairs']}/{p}.pending" for p in range(layout.buckets)]
    job("decide_near_duplicates", f"decide_near_duplicates({found!r}, {pending!r}, {messages!r}, {names!r}, s, "
                                  f"{n}, '{w['near']}')")  # fmt: skip
    job("plan_shards", f"plan_from_counts({pieces + [str(w['near'] / 'near_dropped.parquet')]!r}, '{w['plan']}', "
                       f"dataset='ds', samples_per_shard=10000, near=s, found='{w['near']}')")  # fmt: skip

    import pyarrow as pa

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
            continue  # left out before the search (a repeated or excluded key): not compared, rightly
        hit[d][1] += 1
        a, b = sorted((ident(i), ident(j)))
        hit[d][0] += (a, b) in got
    low = [hit[d] for d in (1, 2, 3)]
    high = [hit[d] for d in range(4, 9)]
    shards = len(list(w["plan"].glob("*.parts")))
    total_cpu = sum(j["cpu_s"] for v in jobs.values() for j in v)
    return {
        "samples": n, "parts": len(paths), "groups": len(groups), "cells": layout.cells, "buckets": layout.buckets,
        "shards": shards, "pairs": len(pair_table), "decision_rounds": rounds, "waiting_after_rounds": waiting,
        "near_duplicates": len(pd.read_parquet(w["near"] / "near_duplicates.parquet", columns=["key"])),
        "recall_1_3_bits": sum(h for h, _ in low) / max(1, sum(t for _, t in low)),
        "recall_4_8_bits": sum(h for h, _ in high) / max(1, sum(t for _, t in high)),
        "cpu_us_per_sample": round(total_cpu / n * 1e6, 1),
        "jobs": {k: {"count": len(v), "max_peak_mib": round(max(j["peak_mib"] for j in v), 1),
                     "max_cpu_s": max(j["cpu_s"] for j in v), "total_cpu_s": round(sum(j["cpu_s"] for j in v), 1)}
                 for k, v in jobs.items()},
    }  # fmt: skip


TARGETS = {"CC12M": 12_400_000, "LAION-400M": 413_900_000, "LAION-5B": 5_850_000_000}
PER_PIECE = {"split_keys", "collect_dropped", "split_near_entries", "find_duplicate_keys", "find_near_pairs",
             "decide_near_round"}  # fmt: skip


# What each whole-dataset job's CPU and memory grow with (fitted linearly through the two sizes), or "bounded":
# split_exclusions holds one bucket of exclusion rows, train_near_cells a strided sample; decide_near_duplicates
# holds the samples still waiting after the rounds and a batch of each partition's table (its time: the samples
# left out, merged as a stream); plan_shards the list of shards.
MODEL = {
    "split_exclusions": ("samples", "bounded"),
    "train_near_cells": ("samples", "bounded"),
    "decide_near_duplicates": ("near_duplicates", "bounded"),
    "plan_shards": ("shards", "shards"),
}
SAMPLES_PER_SHARD = 10_000


def extrapolate(results: list[dict], n: int, plans: list[dict] = ()) -> dict:
    """Each job kind at n samples: jobs per group or bucket as measured at the larger size (their input does not
    grow), whole-dataset jobs fitted linearly in what they grow with (MODEL). Pairs scale with the samples, as
    the planted ones do; chance pairs of unrelated hashes grow with the square (docs/near-duplicates.md)."""
    from shardsmith.shards.neardup import NearSettings

    small, large = results[0], results[-1]
    layout = NearSettings().layout(n)
    parts = math.ceil(n / PART_SIZE)
    groups = math.ceil(parts / max(1, NearSettings().bucket_samples // PART_SIZE))
    drivers = {"samples": n, "pairs": large["pairs"] / large["samples"] * n, "shards": n / SAMPLES_PER_SHARD,
               "near_duplicates": large["near_duplicates"] / large["samples"] * n}  # fmt: skip
    out = {
        "samples": n,
        "buckets": layout.buckets,
        "cells": layout.cells,
        "groups": groups,
        "pairs": round(drivers["pairs"]),
    }
    for kind, got in large["jobs"].items():
        if kind in PER_PIECE:
            rounds = NearSettings().decision_rounds
            count = {"find_duplicate_keys": layout.buckets, "find_near_pairs": layout.buckets,
                     "decide_near_round": layout.buckets * rounds}.get(kind, groups)  # fmt: skip
            peak, cpu = got["max_peak_mib"], got["max_cpu_s"]
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
    shards = n / SAMPLES_PER_SHARD
    if len(plans) >= 2:  # plan_shards measured alone at thousands of parts; below the first, that one's figures
        a, b = plans[0], plans[-1]

        def line(key: str) -> float:
            slope = (b[key] - a[key]) / (b["shards"] - a["shards"])
            return a[key] if shards <= a["shards"] else b[key] + max(0.0, slope) * (shards - b["shards"])

        cpu_min = round(line("cpu_s") / 60, 1)
        out["plan_shards"] = {"jobs": 1, "peak_mib": round(line("peak_mib")), "cpu_min": cpu_min}
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
    got = run_job(
        "from shardsmith.shards.plan import plan_from_counts; from shardsmith.shards.neardup import NearSettings\n"
        f"plan_from_counts({pieces!r}, '{work / 'plan'}', dataset='ds', samples_per_shard={SAMPLES_PER_SHARD}, "
        "near=NearSettings(), found=None, log=lambda m: None)"
    )
    return {"parts": parts, "shards": parts * PART_SIZE // SAMPLES_PER_SHARD, **got}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 4_000_000])
    ap.add_argument("--work", default=None, help="where the generated tables go (removed after)")
    ap.add_argument("--plan-parts", type=int, nargs="*", default=[1000, 4000],
                    help="plan_shards alone at these part counts (measure_plan)")  # fmt: skip
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="plan-scale-", dir=args.work))
    try:
        results = [measure(n, work / str(n)) for n in args.sizes]
        plans = [measure_plan(p, work / f"plan-{p}") for p in args.plan_parts]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = {"bench": "plan_scale", "part_size": PART_SIZE, "sizes": results, "plan_shards_alone": plans,
              "extrapolated": {name: extrapolate(results, n, plans) for name, n in TARGETS.items()}}  # fmt: skip
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
