"""Near-duplicate recall as the cells grow finer, and what holding it costs.

    python bench/near_probes.py [--cells 4 10 20 40 160 640 2560 5120 10240 40960] [--samples 1000000] [--layouts 4 40]

1. Cells: how often two hashes 4-8 bits apart (as many of each distance) fall in a common cell among each one's
   P nearest, for each cell count (k-means as train_near_cells trains them, 64 training hashes a centroid, on
   uniformly random hashes: the worst case, no structure for the cells to follow) and P = 2, 3, ...; the least
   P reaching 98% is what shardsmith.shards.nearparts.PROBE_TABLE holds.
2. Search: tests.shards.reference.find_near_duplicates on --samples random hashes with 1% planted
   pairs 1-8 bits apart, with one cell and with each --layouts cell count at the probes cell_probes gives and
   at 2: recall per distance and CPU a sample. At 1M samples one cell holds 1M samples, and 4 cells at two
   probes hold 500,000 each, the default cell_samples: the search within a cell at its production size.
   Finer layouts there hold smaller cells, searched more easily than a production cell: they show the
   cells' share. Recall at a size is about the cells' share (1) times the search within a cell.
   Above FLAT_CELLS, cells come in two levels: (1) gives their share and also that of the same cells with
   each vector compared with every cell.
3. --train: train_cells alone at large cell counts (CPU, wall, peak memory), for train_near_cells at LAION
   scale: `--cells --samples 0 --train 40960 163840 --out bench/results/near-cells-training.json`.
Raw figures go to bench/results/near-probes.json.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.e2e_bench import save_result  # noqa: E402

TARGET = 0.98
NEAREST_TIMED = 100_000  # hashes whose nearest cells are timed (CPU of every thread)


def random_codes(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, 2**64 - 1, size=n, dtype=np.uint64, endpoint=True)


def flipped(rng: np.random.Generator, codes: np.ndarray, bits: np.ndarray) -> np.ndarray:
    """Each code with `bits` of its bits (distinct positions) flipped."""
    out = codes.copy()
    for i, d in enumerate(bits):
        for b in rng.choice(64, int(d), replace=False):
            out[i] ^= np.uint64(1) << np.uint64(int(b))
    return out


def _shares(xa: np.ndarray, xb: np.ndarray, cells, most: int) -> dict[int, float]:
    """For P = 1, 2, ...: how often the two vectors of a pair share one of their P nearest cells (each P found
    as the search finds it: in two levels, under 2 x P coarse centroids)."""
    from shardsmith.shards.nearparts import nearest_cells

    shares = {}
    for p in range(1, most + 1):
        na, nb = nearest_cells(xa, cells, p), nearest_cells(xb, cells, p)
        shares[p] = round(float((na[:, :, None] == nb[:, None, :]).any(axis=(1, 2)).mean()), 4)
        if shares[p] >= 0.998:
            break
    return shares


def cell_figures(cells: list[int], pairs: int = 4000) -> list[dict]:
    from shardsmith.shards.nearparts import (
        CELL_TRAIN_PER_CENTROID,
        FLAT_CELLS,
        Cells,
        cell_probes,
        nearest_cells,
        signs,
        train_cells,
    )

    rng = np.random.default_rng(20261125)
    out = []
    for c in cells:
        t = time.process_time()
        trained = train_cells(random_codes(rng, c * CELL_TRAIN_PER_CENTROID), c, True, cell_probes(c))
        train_s = time.process_time() - t
        a = random_codes(rng, pairs)
        xa, xb = signs(a), signs(flipped(rng, a, rng.integers(4, 9, size=pairs)))
        shares = _shares(xa, xb, trained, min(c, 40))
        least = next((p for p, s in shares.items() if s >= TARGET), None)
        many = signs(random_codes(rng, NEAREST_TIMED))  # as a group's job finds them: many at once
        t = time.process_time()
        nearest_cells(many, trained, least or 40)
        row = {"cells": c, "coarse": len(trained.coarse), "train_cpu_s": round(train_s, 1),
               "share_by_probes": shares, "least_probes_for_target": least,
               "nearest_cpu_us_per_hash": round(1e6 * (time.process_time() - t) / NEAREST_TIMED, 1)}  # fmt: skip
        if c > FLAT_CELLS:  # the same cells, each vector compared with every one of them
            flat = Cells.flat(trained.centroids)
            t = time.process_time()
            nearest_cells(many, flat, least or 40)
            row["nearest_cpu_us_per_hash_all_cells"] = round(1e6 * (time.process_time() - t) / NEAREST_TIMED, 1)
            row["share_by_probes_all_cells"] = _shares(xa, xb, flat, min(c, 40))
        out.append(row)
        print(row, flush=True)
    return out


def search_figures(samples: int, layouts: list[int]) -> list[dict]:
    from shardsmith.shards.neardup import NearSettings
    from shardsmith.shards.nearparts import Layout, cell_probes
    from tests.shards.reference import find_near_duplicates

    rng = np.random.default_rng(7)
    codes, mirrors = random_codes(rng, samples), random_codes(rng, samples)
    planted = samples // 100
    bits = rng.integers(1, 9, size=planted)
    src = rng.choice(samples // 2, planted, replace=False)
    dst = samples // 2 + rng.choice(samples - samples // 2, planted, replace=False)
    codes[dst] = flipped(rng, codes[src], bits)
    out = []
    with tempfile.TemporaryDirectory(prefix="near-probes-") as folder:
        paths = []
        for p, idx in enumerate(np.array_split(np.arange(samples), 4)):
            path = Path(folder) / f"p{p}.parquet"
            table = pd.DataFrame({"key": [f"k{i:09d}" for i in idx], "source_id": [f"s{i}" for i in idx],
                                  "width_before": 100, "height_before": 100, "bytes_before": 1000,
                                  "phash": [f"{int(c):016x}" for c in codes[idx]],
                                  "phash_mirror": [f"{int(c):016x}" for c in mirrors[idx]]})  # fmt: skip
            table.to_parquet(path, index=False)
            paths.append(str(path))
        runs = [(1, 1)] + [(c, p) for c in layouts for p in sorted({2, cell_probes(c)})]
        for c, p in runs:
            t = time.process_time()
            near, _ = find_near_duplicates(paths, [f"p{i}" for i in range(4)], NearSettings(phash_max_distance=8),
                                           layout=Layout(cells=c, buckets=1, probes=p), work=folder)  # fmt: skip
            cpu = time.process_time() - t
            # found: one of the two left out (the copy for the original, or the original for a chance neighbour,
            # when the rule keeps the copy: no chains); chance pairs are about 1 in 6,000 samples at 1M
            out_keys = set(near["key"])
            hit = np.array([f"k{d:09d}" in out_keys or f"k{s:09d}" in out_keys for s, d in zip(src, dst, strict=True)])
            by = {int(d): round(float(hit[bits == d].mean()), 4) for d in range(1, 9)}
            far = bits >= 4
            row = {"cells": c, "probes": p, "recall_4_8": round(float(hit[far].mean()), 4),
                   "recall_1_3": round(float(hit[~far].mean()), 4), "recall_by_bits": by,
                   "cpu_us_per_sample": round(1e6 * cpu / samples, 1)}  # fmt: skip
            out.append(row)
            print(row, flush=True)
    return out


def train_figures(cells: list[int]) -> list[dict]:
    """train_cells alone (what train_near_cells runs) on cells x CELL_TRAIN_PER_CENTROID random hashes, at the
    probes cell_probes gives: CPU of every thread, wall, and the process's peak memory so far."""
    import resource

    from shardsmith.shards.nearparts import CELL_TRAIN_PER_CENTROID, cell_probes, train_cells

    rng = np.random.default_rng(1)
    out = []
    for c in cells:
        codes = random_codes(rng, c * CELL_TRAIN_PER_CENTROID)
        t, w = time.process_time(), time.time()
        trained = train_cells(codes, c, True, cell_probes(c))
        row = {"cells": c, "probes": cell_probes(c), "coarse": len(trained.coarse),
               "cpu_s": round(time.process_time() - t, 1), "wall_s": round(time.time() - w, 1),
               "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}  # fmt: skip
        out.append(row)
        print(row, flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cells", type=int, nargs="*", default=[4, 10, 20, 40, 160, 640, 2560, 5120, 10240, 40960])
    ap.add_argument("--samples", type=int, default=1_000_000)
    ap.add_argument("--layouts", type=int, nargs="*", default=[4, 40])
    ap.add_argument("--train", type=int, nargs="*", default=[], help="train_cells alone at these cell counts")
    ap.add_argument("--out", type=Path, default=REPO / "bench/results/near-probes.json")
    args = ap.parse_args()
    result = {"target_share": TARGET, "cells": cell_figures(args.cells)}
    if args.train:
        result["train"] = train_figures(args.train)
    if args.samples:
        result["search"] = {"samples": args.samples, "runs": search_figures(args.samples, args.layouts)}
    save_result(args.out, result)


if __name__ == "__main__":
    main()
