"""A cell's search with its bins as row numbers into the arrays held (nearsearch.held_pairs, what find_near_pairs
runs) against bins written to files (nearsearch.near_pairs), alternating in one process: CPU a row, same pairs.

    python bench/held_bins.py [--rows 900000] [--rounds 2] [--out bench/results/held-bins.json]

The cell is what a bucket job searches at the default sizes: about 900,000 rows (a 500,000-sample cell's hashes
and its mirror hashes, uniformly random 64-bit codes with 1% planted copies 1-8 bits apart), bins of
`dedupe.bin_size` 20,000.
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
from shardsmith.shards.nearsearch import MIRROR, held_pairs, near_pairs  # noqa: E402

BIN_SIZE = 20_000


def cell(rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """ids (the second half mirror rows of the first) and codes, 1% of the samples planted copies."""
    rng = np.random.default_rng(seed)
    half = rows // 2
    codes = rng.integers(0, 2**63, size=rows, dtype=np.int64).astype(np.uint64) << np.uint64(1)
    copies = rng.choice(half, size=half // 100, replace=False)
    for i in copies[copies > 0]:
        flip = rng.choice(64, int(rng.integers(1, 9)), replace=False).astype(np.uint64)
        codes[i] = codes[i - 1] ^ np.bitwise_or.reduce(np.uint64(1) << flip)
    ids = np.arange(rows, dtype=np.int64) % half
    ids[half:] |= MIRROR
    return ids, codes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=900_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=REPO / "bench/results/held-bins.json")
    args = ap.parse_args()
    ids, codes = cell(args.rows)
    runs: dict[str, list[float]] = {"files": [], "held": []}
    results = {}
    for _ in range(args.rounds):
        for name in runs:
            with tempfile.TemporaryDirectory(prefix="held-bins-") as tmp:
                t = time.process_time()
                if name == "files":

                    def chunks():
                        for at in range(0, len(ids), 100_000):
                            yield ids[at : at + 100_000], codes[at : at + 100_000]

                    got = near_pairs(chunks, len(ids), 8, True, BIN_SIZE, tmp)
                else:
                    got = held_pairs(ids, codes, 8, True, BIN_SIZE)
                runs[name].append(time.process_time() - t)
            results[name] = got
    same = all((a == b).all() for a, b in zip(results["files"], results["held"], strict=True))
    if not same:
        raise SystemExit("held_pairs and near_pairs found different pairs")
    best = {k: min(v) for k, v in runs.items()}
    result = {
        "bench": "held_bins",
        "rows": args.rows,
        "bin_size": BIN_SIZE,
        "pairs": len(results["held"][0]),
        "same_pairs": same,
        "cpu_s": runs,
        "cpu_us_per_row": {k: round(v / args.rows * 1e6, 2) for k, v in best.items()},
        "held_over_files": round(best["held"] / best["files"], 3),
    }
    print(result)
    save_result(args.out, result)


if __name__ == "__main__":
    main()
