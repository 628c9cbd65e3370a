"""A cell's hashes searched two ways, alternating in one process: k-means bins
(tests.shards.reference_search.near_pairs, each hash in 5 bins of dedupe.bin_size) and sampled-bit tables
(nearsearch.held_pairs, what find_near_pairs runs): CPU a row and the share of planted pairs found at each distance.

    python bench/cell_search.py [--rows 1000000] [--rounds 2] [--out bench/results/cell-search.json]

A cell is what a bucket job searches at the default sizes: about a million rows (a 500,000-sample cell's hashes and
its mirror hashes) with 1% of the samples planted copies 1-8 bits from another. Two kinds of cell: `uniform`
(random 64-bit hashes, no structure for k-means to follow) and `clustered` (hashes drawn around 2,000 centres,
each bit of a hash flipped from its centre's with probability 0.2: the biased bits real photos of one kind share,
which make the tables' keys uneven). Both ways return only true pairs; what differs is which near pairs they miss
and what they cost.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.e2e_bench import save_result  # noqa: E402
from shardsmith.shards.nearsearch import MIRROR, held_pairs, sampled_bit_tables  # noqa: E402
from tests.shards.reference_search import near_pairs  # noqa: E402

BIN_SIZE = 20_000
CENTRES, FLIP = 2_000, 0.2


def _flips(rng: np.random.Generator, n: int, p: float) -> np.ndarray:
    bits = rng.random((n, 64)) < p
    return np.packbits(bits, axis=1, bitorder="little").view("<u8").ravel()


def cell(rows: int, kind: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int, int]]]:
    """ids (the second half mirror rows of the first), codes, and the planted pairs (row, row, bits apart)."""
    rng = np.random.default_rng(seed)
    half = rows // 2
    if kind == "uniform":
        codes = rng.integers(0, 2**63, size=rows, dtype=np.int64).astype(np.uint64) << np.uint64(1)
        codes |= rng.integers(0, 2, size=rows).astype(np.uint64)
    else:
        centres = rng.integers(0, 2**63, size=CENTRES, dtype=np.int64).astype(np.uint64) << np.uint64(1)
        codes = centres[rng.integers(0, CENTRES, rows)] ^ _flips(rng, rows, FLIP)
    planted = []
    for i in np.sort(rng.choice(np.arange(1, half), size=half // 100, replace=False)).tolist():
        bits = int(rng.integers(1, 9))
        flip = rng.choice(64, bits, replace=False).astype(np.uint64)
        codes[i] = codes[i - 1] ^ np.bitwise_or.reduce(np.uint64(1) << flip)
        planted.append((i - 1, i, bits))
    ids = np.arange(rows, dtype=np.int64) % half
    ids[half:] |= MIRROR
    return ids, codes, planted


def search(way: str, ids: np.ndarray, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if way == "sampled_bits":
        return held_pairs(ids, codes, 8, True, BIN_SIZE)
    with tempfile.TemporaryDirectory(prefix="cell-search-") as tmp:

        def chunks():
            for at in range(0, len(ids), 100_000):
                yield ids[at : at + 100_000], codes[at : at + 100_000]

        return near_pairs(chunks, len(ids), 8, True, BIN_SIZE, tmp)


def found_by_distance(got, planted) -> dict[int, float]:
    pairs = set(zip(got[0].tolist(), got[1].tolist(), strict=True))
    out = {}
    for d in range(1, 9):
        at = [(a, b) for a, b, bits in planted if bits == d]
        out[d] = round(sum(p in pairs for p in at) / max(1, len(at)), 4)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=REPO / "bench/results/cell-search.json")
    args = ap.parse_args()
    bits, tables = sampled_bit_tables(args.rows, 8)
    result = {"bench": "cell_search", "rows": args.rows, "bin_size": BIN_SIZE, "sampled_bits": bits,
              "tables": tables, "cells": {}}  # fmt: skip
    for kind in ("uniform", "clustered"):
        ids, codes, planted = cell(args.rows, kind)
        cpu: dict[str, list[float]] = {"kmeans_bins": [], "sampled_bits": []}
        got = {}
        for _ in range(args.rounds):
            for way in cpu:
                t = time.process_time()
                got[way] = search(way, ids, codes)
                cpu[way].append(round(time.process_time() - t, 2))
        best = {k: min(v) for k, v in cpu.items()}
        sets = {k: set(zip(v[0].tolist(), v[1].tolist(), strict=True)) for k, v in got.items()}
        by_d = {k: found_by_distance(v, planted) for k, v in got.items()}
        result["cells"][kind] = {
            "planted": len(planted),
            "cpu_s": cpu,
            "cpu_us_per_row": {k: round(v / args.rows * 1e6, 2) for k, v in best.items()},
            "sampled_over_kmeans_cpu": round(best["sampled_bits"] / best["kmeans_bins"], 3),
            "planted_found_by_bits": by_d,
            "planted_found_4_8_bits": {
                k: round(float(np.mean([v[d] for d in range(4, 9)])), 4) for k, v in by_d.items()
            },  # fmt: skip
            "pairs": {k: len(v) for k, v in sets.items()},
            "pairs_only_kmeans": len(sets["kmeans_bins"] - sets["sampled_bits"]),
            "pairs_only_sampled": len(sets["sampled_bits"] - sets["kmeans_bins"]),
        }
        print(kind, result["cells"][kind], flush=True)
    save_result(args.out, result)


if __name__ == "__main__":
    main()
