"""Peak memory of the dataset-wide jobs as the dataset grows: plan_shards, index_shards, validate_dataset.

    python bench/memory_scale.py [--samples 100000 400000 1600000] [--part-size 5000]

These three see every sample of a dataset (the per-part and per-shard jobs see one part or shard, and
e2e_bench measures them). index_shards and validate_dataset work from pieces (bench/index_scale.py
measures them at LAION counts); here validate_dataset runs its check without the buckets' sums, the
manifest's keys sorted into bins on disk. For each size it writes processed-part sample tables as
download_part leaves them (realistic keys, URLs and sha256s; 1% of keys repeated in a later part), then
runs the job functions, each in a fresh interpreter, and records its peak RSS. The issue's target is memory
per job under 1 GiB at the default part size and flat as the dataset grows; the slope (bytes per added
sample) says how flat.
Raw figures go to bench/results/memory-scale.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.e2e_bench import save_result  # noqa: E402
from bench.index_scale import index_jobs  # noqa: E402
from shardsmith.core.ledger import REJECT_COLUMNS  # noqa: E402
from shardsmith.formats.index import write_manifest_piece  # noqa: E402
from shardsmith.formats.parts import SAMPLE_COLUMNS  # noqa: E402


def write_parts(folder: Path, samples: int, part_size: int, rng: np.random.Generator) -> list[str]:
    """Sample tables of samples/part_size parts; every 100th key repeats one of the part before."""
    paths = []
    for p in range(samples // part_size):
        i = np.arange(p * part_size, (p + 1) * part_size)
        keys = np.char.add(f"web-{p:06d}-", i.astype(str)).astype(object)
        if p:  # rows 0, 100, ... repeat rows 1, 101, ... of the part before (which are never repeats)
            keys[::100] = [f"web-{p - 1:06d}-{k}" for k in i[::100] - part_size + 1]
        n = len(i)
        df = pd.DataFrame(
            {
                "key": keys, "source": "web", "source_id": i.astype(str),
                "url": np.char.add("https://images.example.com/photos/2024/", np.char.add(i.astype(str), ".jpg")),
                "width_before": rng.integers(200, 6000, n), "height_before": rng.integers(200, 6000, n),
                "width": rng.integers(64, 512, n), "height": rng.integers(64, 512, n),
                "bytes": rng.integers(10_000, 90_000, n), "bytes_before": rng.integers(10_000, 900_000, n),
                "sha256": [f"{x:064x}" for x in rng.integers(0, 2**62, n)], "caption_length": rng.integers(5, 300, n),
                "caption_field": "caption", "passthrough": rng.random(n) < 0.3,
                "phash": [f"{x:016x}" for x in rng.integers(0, 2**63, n)],
                "phash_mirror": [f"{x:016x}" for x in rng.integers(0, 2**63, n)],
                "language": "en", "language_score": 0.99, "blurred": 0,
                "jpg_offset": i * 4096, "jpg_size": 3000, "txt_offset": i * 4096 + 3584, "txt_size": 40,
                "json_offset": i * 4096 + 3712, "json_size": 300,
            }
        )[SAMPLE_COLUMNS]  # fmt: skip
        path = folder / f"web-{p:06d}.samples.parquet"
        df.to_parquet(path, index=False)
        pd.DataFrame({"rid": np.arange(n)}).to_parquet(folder / f"web-{p:06d}.status.parquet")
        pd.DataFrame(columns=REJECT_COLUMNS).to_parquet(folder / f"web-{p:06d}.rejected.parquet")
        paths.append(str(path))
    return paths


def peak_rss_mib(code: str) -> tuple[float, float]:
    """Peak RSS (MiB) and seconds of `code` run in a fresh interpreter (which reports its own ru_maxrss)."""
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", f"import resource, sys; sys.path.insert(0, {str(REPO)!r})\n{code}\n"
         "print('maxrss', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    took = time.perf_counter() - t0
    kib = int(done.stdout.split("maxrss")[-1])
    return round(kib / 1024, 1), round(took, 1)


def measure(folder: Path, samples: int, part_size: int, per_shard: int) -> dict:
    rng = np.random.default_rng(7)
    parts = write_parts(folder, samples, part_size, rng)
    part_ids = [Path(p).name.split(".")[0] for p in parts]
    plan = folder / "plan"
    out: dict = {"samples": samples, "parts": len(parts)}
    args = folder / "args.json"  # paths go through a file: thousands of them overflow a command line
    args.write_text(json.dumps({"parts": parts, "part_ids": part_ids}))
    load = f"import json\na = json.load(open({str(args)!r}))\n"
    out["plan_shards"] = peak_rss_mib(  # the planning jobs one after another (tests.shards.reference)
        f"{load}from tests.shards.reference import plan_in_process\n"
        f"plan_in_process(a['parts'], a['part_ids'], 'ds', {per_shard}, {str(plan)!r})"
    )
    names = sorted(p.name.split(".")[0] for p in plan.glob("*.samples.parquet"))
    infos = []
    for n in names:  # what write_shard leaves (no tars are written: the index jobs do not read them)
        table = pq.read_table(plan / f"{n}.samples.parquet")
        rows = table.num_rows
        info = folder / f"{n}.json"
        counts = write_manifest_piece(table, f"{n}.tar", folder / f"{n}.manifest.parquet")
        info.write_text(
            json.dumps(
                {"shard": f"{n}.tar", "nsamples": rows, "filesize": rows * 4096, "md5sum": "0" * 32, "sha256": "0" * 64}
                | counts
            )
        )
        (folder / f"{n}.report.json").write_text(
            json.dumps(
                {
                    "shard": f"{n}.tar",
                    "loader": "open_clip_train.data",
                    "groups": rows,
                    "passed": rows,
                    "decoded": 0,
                    "problems": [],
                }
            )
        )
        infos.append(str(info))
    plans = [str(folder / f"{n}.manifest.parquet") for n in names]  # the manifest's pieces, as write_shard leaves them
    status = [p.replace(".samples.", ".status.") for p in parts]
    rejected = [*(p.replace(".samples.", ".rejected.") for p in parts), str(plan / "dropped.parquet")]
    index = folder / "index"
    reports = [str(folder / f"{n}.report.json") for n in names]
    args.write_text(
        json.dumps({"infos": infos, "manifests": plans, "status": status, "rejected": rejected, "reports": reports})
    )
    out |= index_jobs(args, index, peak_rss_mib, by_bucket=False)
    stats = json.loads((index / "stats.json").read_text())
    assert stats["input_records"] == samples == stats["published"] + stats["rejected"], stats
    out["duplicates_dropped"] = stats["rejected_by_reason"].get("shard/duplicate_key", 0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, nargs="+", default=[100_000, 400_000, 1_600_000])
    ap.add_argument("--part-size", type=int, default=5000)
    ap.add_argument("--samples-per-shard", type=int, default=10_000)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "memory-scale.json")
    a = ap.parse_args()
    rows = []
    for n in sorted(a.samples):
        with tempfile.TemporaryDirectory(prefix="memory-scale-") as tmp:
            rows.append(measure(Path(tmp), n, a.part_size, a.samples_per_shard))
        print(json.dumps(rows[-1]), flush=True)
    result = {
        "what": "peak RSS (MiB) and seconds of the dataset-wide jobs, each in a fresh interpreter",
        "part_size": a.part_size,
        "samples_per_shard": a.samples_per_shard,
        "rows": rows,
        **verdict(rows),
    }
    save_result(a.out, result)
    print(json.dumps({k: result[k] for k in ("bytes_per_added_sample", "target")}, indent=1))


def verdict(rows: list[dict]) -> dict:
    """Bytes per added sample from the two largest sizes, and the target: under 1 GiB and flat (under one
    byte per added sample), or by how much it is missed."""
    jobs = ("plan_shards", "index_shards", "validate_dataset")
    (a, b) = rows[-2:] if len(rows) > 1 else (rows[0], rows[0])
    slope = {j: round((b[j][0] - a[j][0]) * 2**20 / max(1, b["samples"] - a["samples"]), 1) for j in jobs}
    peak = max(r[j][0] for r in rows for j in jobs)
    flat = all(v < 1.0 for v in slope.values())
    target = {
        "target": "< 1024 MiB per job, flat as the dataset grows",
        "peak_mib": peak,
        "under_1gib": peak < 1024,
        "flat": flat,
        "met": peak < 1024 and flat,
    }
    if not flat:
        worst = max(slope, key=slope.get)
        target["short_by"] = (
            f"{slope[worst]} bytes per added sample ({worst}, {a['samples']:,} -> {b['samples']:,} samples)"
        )
        target["bounded_by"] = [
            "not traced further: with fixed-size parts, per-part overhead and allocator growth look alike",
            "the binned key check holds one bin (BIN_ROWS keys) at a time; bins grow past 512 of them",
        ]
    return {"bytes_per_added_sample": slope, "target": target}


if __name__ == "__main__":
    main()
