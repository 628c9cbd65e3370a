"""Selection over the whole dataset at scale: the jobs of `select` (shardsmith.embed.select) on generated scores,
against the whole pool in one pandas frame (what a user does today around a build: read every score, nlargest).

Generates `--sizes` samples' score tables across `--parts` parts (a similarity drawn from a mixture
of normals, rounded to float32, some NaN, many ties where a model's scores repeat), a group per part, then runs
summarize_scores per group, decide_selection, and select_samples per group, each kind in a process of its own
(spawn), and 8 jobs of each kind spread over the parts again each in a fresh process: a kind's peak RSS is
the largest of those. States the count kept against round(fraction x
scored), whether every kept sample scores at least every left-out one but within the threshold's bin, and the
kept set against the one-frame peer's (equal where no tie crosses the threshold's bin).

    python bench/select_bench.py --sizes 1000000 20000000 --parts 40 400 --out bench/results/select-scale.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from shardsmith.embed.select import (  # noqa: E402
    SelectRule,
    decide_selection,
    kept_count,
    select_samples,
    summarize_scores,
)

COLUMN = "clip_l14_similarity_score"
FRACTION = 0.3


def write_part(path: str, first: int, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    sim = np.where(rng.random(n) < 0.7, rng.normal(0.3, 0.05, n), rng.normal(0.18, 0.04, n)).astype(np.float32)
    repeated = rng.random(n) < 0.02
    sim[repeated] = np.round(sim[repeated], 2)  # values a model gives many images: ties
    sim[rng.random(n) < 0.001] = np.nan  # an image that failed to embed
    keys = np.char.add("s", np.arange(first, first + n).astype(str))
    pd.DataFrame({"key": keys, COLUMN: sim}).to_parquet(path, index=False)


def peak_mb() -> float:
    """This process's peak RSS (VmHWM: since its exec, unlike ru_maxrss, which keeps the forking parent's)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _summarize(args):
    path, out = args
    summarize_scores([path], RULES, out)
    return peak_mb()


def _select(args):
    path, selection_path, group, out = args
    selection = json.loads(Path(selection_path).read_text())
    n = select_samples([path], RULES, selection, group, out)
    return n, peak_mb()


def _decide(args):
    summaries, out = args
    decide_selection(summaries, RULES, "ViT-L-14", out)
    return peak_mb()


def _peer(paths):
    """The whole pool in one frame: every score read, the top fraction taken with nlargest."""
    frame = pd.concat([pd.read_parquet(p) for p in paths], ignore_index=True)
    scored = frame.dropna(subset=[COLUMN])
    kept = scored.nlargest(kept_count(FRACTION, len(scored)), COLUMN, keep="first")
    return set(kept["key"]), peak_mb()


RULES = [SelectRule("clip_top30", COLUMN, top_fraction=FRACTION)]
PEAK_JOBS = 8


def run(size: int, parts: int, work: Path) -> dict:
    work.mkdir(parents=True)
    part_samples = -(-size // parts)
    paths = [str(work / f"web-{i:06d}.parquet") for i in range(parts)]
    for i, p in enumerate(paths):
        write_part(p, i * part_samples, min(part_samples, size - i * part_samples), seed=i)
    groups = [f"{i:05d}" for i in range(parts)]
    spawn = get_context("spawn")
    result: dict = {"samples": size, "parts": parts, "part_samples": part_samples, "fraction": FRACTION}
    t0 = time.perf_counter()
    summarize_jobs = [(p, str(work / f"{g}.npz")) for p, g in zip(paths, groups, strict=True)]
    with ProcessPoolExecutor(1, mp_context=spawn) as pool:
        list(pool.map(_summarize, summarize_jobs))
    t1 = time.perf_counter()
    with ProcessPoolExecutor(1, mp_context=spawn) as pool:
        summaries = {g: str(work / f"{g}.npz") for g in groups}
        decide_peak = pool.submit(_decide, (summaries, str(work / "selection.json"))).result()
    t2 = time.perf_counter()
    with ProcessPoolExecutor(1, mp_context=spawn) as pool:
        jobs = [
            (p, str(work / "selection.json"), g, str(work / f"{g}.out.parquet"))
            for p, g in zip(paths, groups, strict=True)
        ]
        list(pool.map(_select, jobs))
    t3 = time.perf_counter()
    # a job's peak memory: PEAK_JOBS of each kind spread over the parts, each in a fresh process
    picked = sorted({round(i * (parts - 1) / max(PEAK_JOBS - 1, 1)) for i in range(PEAK_JOBS)})
    with ProcessPoolExecutor(1, mp_context=spawn, max_tasks_per_child=1) as pool:
        summarize_peaks = list(pool.map(_summarize, [summarize_jobs[i] for i in picked]))
        select_peaks = [p for _, p in pool.map(_select, [jobs[i] for i in picked])]
    with ProcessPoolExecutor(1, mp_context=spawn) as pool:
        peer_kept, peer_peak = pool.submit(_peer, paths).result()
    t4 = time.perf_counter()
    selection = json.loads((work / "selection.json").read_text())["rules"]["clip_top30"]
    left_out = pd.concat([pd.read_parquet(work / f"{g}.out.parquet", columns=["key"]) for g in groups])["key"]
    scores = pd.concat([pd.read_parquet(p) for p in paths], ignore_index=True).set_index("key")[COLUMN]
    kept = scores.drop(left_out.to_numpy())
    out_scores = scores[left_out.to_numpy()].dropna()
    threshold = selection["threshold"]
    result |= {
        "scored": selection["scored"],
        "kept": len(kept),
        "kept_asked": kept_count(FRACTION, selection["scored"]),
        "kept_exact": len(kept) == kept_count(FRACTION, selection["scored"]),
        "threshold": threshold,
        "kept_all_at_or_above_threshold": bool(kept.min() >= threshold),
        "left_out_above_threshold": int((out_scores >= threshold).sum()),  # in the threshold's bin, later in order
        "left_out_max_over_threshold": float(out_scores.max() / threshold - 1) if len(out_scores) else None,
        "same_set_as_peer": set(kept.index) == peer_kept,
        "differs_from_peer": len(set(kept.index) ^ peer_kept),
        "seconds": {
            "summarize_scores": round(t1 - t0, 2), "decide_selection": round(t2 - t1, 2),
            "select_samples": round(t3 - t2, 2), "peer_one_frame": round(t4 - t3, 2),
        },
        "peak_rss_mb": {
            "summarize_scores (largest job)": round(max(summarize_peaks)), "decide_selection": round(decide_peak),
            "select_samples (largest job)": round(max(select_peaks)), "peer_one_frame": round(peer_peak),
        },
    }  # fmt: skip
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 20_000_000])
    ap.add_argument("--parts", type=int, nargs="+", default=[40, 400], help="parts of each size, in order")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "select-scale.json")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="select-bench-"))
    try:
        runs = [run(size, parts, tmp / str(size)) for size, parts in zip(a.sizes, a.parts, strict=True)]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    result = {"runs": runs, "machine": {"cores": os.cpu_count()}, "when": time.strftime("%Y-%m-%d %H:%M:%S"),
              "command": " ".join(["bench/select_bench.py", *sys.argv[1:]])}  # fmt: skip
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
