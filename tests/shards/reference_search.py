"""The pair search of a whole dataset in one call, binned through files: bench/near_bench.py's search of embeddings
at millions of vectors, and what the tests compare held_pairs' in-memory bins with. No rule reaches it: the
workflow searches a bucket's cells (shardsmith.shards.nearparts, nearsearch.held_pairs).

Up to `bin_size` vectors the search is exact (nearsearch.exact_pairs). Above it, faiss k-means (fixed seed) on a
sample gives ceil(probes x n / bin_size) centroids; each vector goes to the bins of its PROBES nearest centroids,
files under `scratch`, and each bin is searched exactly: memory is bounded by the largest bin, not by n, and a
pair is missed only when its two vectors share no bin. Hashes also go through block_pairs, which finds every
pair at most 3 bits apart whatever the bins did. `chunks()` is read once to train, once to spill, and for hashes
64 more times by block_pairs: callers pass views of arrays they hold.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from pathlib import Path

import faiss
import numpy as np

from shardsmith.shards.nearsearch import (
    BIN_PROBES,
    MIRROR,
    Chunks,
    _as_float,
    _train,
    best_pairs,
    exact_pairs,
    same_key_pairs,
)

BLOCK_RANGES = 16  # passes per block: the hashes sorted at once are a 16th of them
# Bins each vector goes to (recall against time: bench/near_bench.py). Hashes take five: on a million random
# hashes, 5 finds 97% of pairs 2-8 bits apart in 62 s, 3 finds 92% in 38 s (and 3 with bins three times larger
# 95% in 97 s). Embeddings as held_pairs bins them.
PROBES = {True: 5, False: BIN_PROBES}


def near_pairs(
    chunks: Chunks,
    n: int,
    threshold: float,
    binary: bool,
    bin_size: int,
    scratch: str | os.PathLike | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """best_pairs over all `n` vectors that `chunks()` yields (see the module)."""
    probes = PROBES[binary]
    if n <= bin_size:
        got = list(chunks())
        ids = np.concatenate([c[0] for c in got]) if got else np.empty(0, np.int64)
        x = np.concatenate([c[1] for c in got]) if got else np.empty((0, 1))
        return best_pairs(*exact_pairs(ids, x, threshold, binary), binary)
    k = math.ceil(probes * n / bin_size)
    centroids = _train(chunks, n, k, binary)
    quantizer = faiss.IndexFlatL2(centroids.shape[1])
    quantizer.add(centroids)
    if scratch is not None:
        Path(scratch).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="shardsmith-near-", dir=scratch))
    try:
        bins = _spill(chunks, quantizer, work, binary, probes)
        found = [exact_pairs(*_read_bin(work, b, binary), threshold, binary) for b in bins]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if binary:
        found += block_pairs(chunks, threshold)
    a, b, s = (np.concatenate([f[i] for f in found]) for i in range(3))
    return best_pairs(a, b, s, binary)


def block_pairs(chunks: Chunks, threshold: float) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Pairs within the threshold among hashes that agree on one of their four 16-bit blocks: every pair at
    most 3 bits apart is one of them (3 differing bits leave one block whole), whatever the bins did.

    For each block, and each 16th of its values in turn (so memory stays a 16th of the hashes), the hashes
    are sorted by the block and each is compared with the next ones of the same value; the work is the sum
    of the squared run lengths, about n^2 / 2^16 a block for hashes spread evenly."""
    found = []
    width = 65536 // BLOCK_RANGES
    for j in range(4):
        for r in range(BLOCK_RANGES):
            parts = []
            for ids, x in chunks():
                block = ((x >> np.uint64(16 * j)) & np.uint64(0xFFFF)).astype(np.int64)
                take = (block >= r * width) & (block < (r + 1) * width)
                parts.append((block[take], x[take], np.asarray(ids, np.int64)[take]))
            block, code, ident = (np.concatenate([p[i] for p in parts]) for i in range(3))
            del parts
            found += same_key_pairs(block, code, ident & ~MIRROR, threshold, (ident & MIRROR) != 0)
    return found


def _spill(chunks: Chunks, quantizer: faiss.Index, work: Path, binary: bool, probes: int) -> list[int]:
    """Append each vector (and its id) to the files of its nearest centroids' bins; returns the bins used."""
    used: set[int] = set()
    for ids, x in chunks():
        _, nearest = quantizer.search(_as_float(x, binary), probes)
        for column in range(probes):
            order = np.argsort(nearest[:, column], kind="stable")
            where = nearest[order, column]
            starts = np.flatnonzero(np.r_[True, where[1:] != where[:-1]])
            for s, e in zip(starts, np.r_[starts[1:], len(order)], strict=True):
                b, rows = int(where[s]), order[s:e]
                with open(work / f"{b}.ids", "ab") as f:
                    f.write(np.ascontiguousarray(ids[rows], np.int64).tobytes())
                with open(work / f"{b}.vec", "ab") as f:
                    f.write(np.ascontiguousarray(x[rows], np.uint64 if binary else np.float16).tobytes())
                used.add(b)
    return sorted(used)


def _read_bin(work: Path, b: int, binary: bool) -> tuple[np.ndarray, np.ndarray]:
    ids = np.fromfile(work / f"{b}.ids", dtype=np.int64)
    raw = np.fromfile(work / f"{b}.vec", dtype=np.uint64 if binary else np.float16)
    return ids, raw if binary else raw.reshape(len(ids), -1)
