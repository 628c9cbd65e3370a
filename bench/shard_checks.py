"""The per-sample cost of write_shard's guarantees, each lever measured alone on the same generated shard.

    python bench/shard_checks.py [--samples 5000] [--image-kb 67] [--rounds 5]

A processed part of `--samples` samples (random image bytes of about `--image-kb` KB, the web-size mix's mean
at 512 px, a caption and a JSON member) is written with ShardWriter; the shard is its copy with a plan that
says where each image lies in the part. Then, alternating, best of `--rounds` (CPU time of this process):

- hashes while writing: the shard written through HashingWriter with md5 and sha256 (both are contracts:
  the wids index's md5sum and the published version's sha256), sha256 only, and none;
- the header walk of the index checks: tarfile's getmembers against tario.scan_members;
- the re-read with OpenCLIP's reader: each image hashed again and compared with the plan's sha256, against
  compared with its processed part's bytes (validate_shard with and without `parts`; no image decoded).

Results go to bench/results/shard-checks.json, in microseconds per sample.
"""

import argparse
import contextlib
import hashlib
import json
import os
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.e2e_bench import save_result
from shardsmith.formats.tario import HashingWriter, ShardWriter, scan_members
from shardsmith.shards.validate import validate_shard

BENCH = Path(__file__).resolve().parent


def make_part(folder: Path, samples: int, image_kb: int) -> tuple[Path, Path, dict[str, str], list]:
    rng = np.random.default_rng(5)
    sizes = rng.integers(image_kb * 512, image_kb * 1536, samples)
    pool = rng.bytes(int(sizes.max()) + samples)
    items, rows = [], []
    part = folder / "web-000000.tar"
    with open(part, "wb") as f, ShardWriter(f, unique_keys=False) as w:
        for i, n in enumerate(sizes):
            key = f"{i:09d}"
            jpg = b"\xff\xd8" + pool[i : i + int(n) - 2]
            members = {"jpg": jpg, "txt": f"a photo number {i}".encode(), "json": b'{"key": "%s"}' % key.encode()}
            where = w.write(key, members)["jpg"]
            items.append((key, members))
            rows.append(
                {"key": key, "sha256": hashlib.sha256(jpg).hexdigest(), "width": 512, "height": 384}
                | {"part": "web-000000", "jpg_offset": where[0], "jpg_size": where[1]}
            )
    plan = folder / "plan.parquet"
    pd.DataFrame(rows).to_parquet(plan, index=False)
    return part, plan, {"web-000000": str(part)}, items


def cpu(fn) -> float:
    t = time.process_time()
    fn()
    return time.process_time() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=5000)
    ap.add_argument("--image-kb", type=int, default=67)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path, default=BENCH / "results" / "shard-checks.json")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="shard-checks-") as tmp:
        folder = Path(tmp)
        part, plan, parts, items = make_part(folder, a.samples, a.image_kb)
        shard = folder / "ds-000000.tar"

        def write(algorithms: tuple[str, ...]) -> None:
            with open(shard, "wb") as f:
                out = HashingWriter(f, algorithms) if algorithms else f
                with ShardWriter(out) as w, open(part, "rb") as src:
                    w.copy_samples(src, 0, os.path.getsize(part) - 1024, [k for k, _ in items])

        def walk_tarfile() -> None:
            with tarfile.open(shard, "r:") as tar:
                tar.getmembers()

        def check(by_part: bool) -> None:
            report = validate_shard(str(shard), str(plan), 512, 25_000_000, 0, parts=parts if by_part else None)
            assert not report["problems"], report["problems"][:3]

        levers = {
            "write, md5 and sha256": lambda: write(("md5", "sha256")),
            "write, sha256 only": lambda: write(("sha256",)),
            "write, no hash": lambda: write(()),
            "header walk, tarfile": walk_tarfile,
            "header walk, scan_members": lambda: scan_members(shard),
            "re-read, images hashed again": lambda: check(False),
            "re-read, images compared with the part": lambda: check(True),
        }
        write(("md5", "sha256"))
        best = {name: float("inf") for name in levers}
        for r in range(a.rounds):
            for name in list(levers)[:: 1 if r % 2 == 0 else -1]:
                best[name] = min(best[name], cpu(levers[name]))
        size = os.path.getsize(shard)
    us = {name: round(s / a.samples * 1e6, 1) for name, s in best.items()}
    result = {
        "samples": a.samples,
        "shard_mb": round(size / 1e6, 1),
        "cpu_us_per_sample": us,
        "saved_us_per_sample": {
            "scan_members": round(us["header walk, tarfile"] - us["header walk, scan_members"], 1),
            "compare with the part": round(
                us["re-read, images hashed again"] - us["re-read, images compared with the part"], 1
            ),
        },
    }
    save_result(a.out, result)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
