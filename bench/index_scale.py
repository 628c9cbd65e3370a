"""index_shards and validate_dataset from pieces, at two sizes: their work grows with shards, parts and
buckets, not with samples.

Generates what the jobs before them leave, at a fraction of LAION-5B's counts with the recommended sizes
(117,000 shards of 50,000 samples, 23,400 parts of 250,000, 11,700 planning groups, 62,400 buckets):
per shard an info file, a validation report and a manifest piece (write_manifest_piece, `--piece-rows`
rows: the index reads a piece's footer and links it, so its rows do not change the work); per part a
status table and a ledger piece of `--ledger-rows` rejections (40% of a 250,000-record part by default:
a web download that finds 60% of its images), with a web download's stages and reasons; per planning
group a ledger piece of drops carrying the shards' `id` column (rewritten by the index without it); per
bucket a find_duplicate_keys file (a batch per group, the kept keys' count and digest sum in its footer).
Then build_index and validate's planned_keys + check_dataset run, each in a fresh interpreter, as the
rules run them; each one's peak RSS, CPU and wall time are recorded, and checked: the ledger adds up, the
shards' keys add up to the planned ones.

Both jobs grow linearly with the fraction (shards, parts, groups, buckets and ledger rows all scale with
it): the CPU is fitted as a + b x fraction and extrapolated to LAION-400M and LAION-5B (CC12M's shards
are 10,000 samples: a bound from above).

    python bench/index_scale.py --fractions 0.0078125 0.03125 --out bench/results/index-scale.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.e2e_bench import save_result  # noqa: E402
from shardsmith.core.ledger import REJECT_COLUMNS  # noqa: E402
from shardsmith.formats.index import REJECT_SCHEMA, write_manifest_piece  # noqa: E402
from shardsmith.formats.shuffle import write_buckets  # noqa: E402
from shardsmith.shards.buckets import DROPS, LEDGER_PIECE  # noqa: E402

LAION_5B = {"samples": 5_850_000_000, "shards": 117_000, "parts": 23_400, "groups": 11_700, "buckets": 62_400}
DATASETS = {"CC12M": 12_400_000, "LAION-400M": 413_900_000, "LAION-5B": 5_850_000_000}
# a web download's rejections, by share (stage, reason)
REASONS = [
    ("download", "http_404", 0.45), ("download", "timeout", 0.2), ("download", "connection", 0.15),
    ("resize", "too_small", 0.1), ("caption", "empty", 0.05), ("process", "not_an_image", 0.05),
]  # fmt: skip
MASK = (1 << 64) - 1


def counts(fraction: float) -> dict[str, int]:
    return {k: max(1, round(v * fraction)) for k, v in LAION_5B.items() if k != "samples"}


def ledger_table(rows: int, part: str, rng: np.random.Generator) -> pa.Table:
    """A part's rejections: dictionary-like columns as parquet stores them, a url and detail each."""
    pick = rng.choice(len(REASONS), size=rows, p=[r[2] for r in REASONS])
    stage = np.array([r[0] for r in REASONS], dtype=object)[pick]
    reason = np.array([r[1] for r in REASONS], dtype=object)[pick]
    i = np.arange(rows).astype(str).astype(object)
    cols = {
        "source": np.full(rows, "laion", dtype=object), "source_id": part + "/" + i,
        "url": "https://images.example.com/photos/2024/" + i + ".jpg", "key": "laion-" + part + "-" + i,
        "stage": stage, "reason": reason, "detail": np.full(rows, "HTTP Error 404: Not Found", dtype=object),
    }  # fmt: skip
    return pa.table({c: pa.array(cols[c], pa.string()) for c in REJECT_COLUMNS}).cast(REJECT_SCHEMA)


def generate(folder: Path, fraction: float, piece_rows: int, ledger_rows: int, drop_rows: int) -> dict:
    """The pieces the index and validation jobs read, and the argument lists the rules give them."""
    rng = np.random.default_rng(11)
    n = counts(fraction)
    folder.mkdir(parents=True)
    plan = pa.table(
        {
            "key": pa.array([f"k{i}" for i in range(piece_rows)], pa.string()), "source": ["laion"] * piece_rows,
            "source_id": [str(i) for i in range(piece_rows)], "url": ["https://x/" + str(i) for i in range(piece_rows)],
            **{c: np.full(piece_rows, 256) for c in ("width_before", "height_before", "width", "height")},
            "bytes": np.full(piece_rows, 30_000), "sha256": ["0" * 64] * piece_rows,
            "caption_length": np.full(piece_rows, 40), "phash": ["0" * 16] * piece_rows,
            "phash_mirror": ["0" * 16] * piece_rows, "passthrough": [True] * piece_rows,
        }
    )  # fmt: skip
    args: dict[str, list[str]] = {k: [] for k in ("infos", "manifests", "reports", "status", "rejected", "drops")}
    shard_sums = rng.integers(0, 2**63, size=n["shards"], dtype=np.int64)
    for s in range(n["shards"]):
        name = f"ds-{s:06d}"
        piece = folder / f"{name}.manifest.parquet"
        info = {"shard": f"{name}.tar", "nsamples": piece_rows, "filesize": piece_rows * 60_000}
        info |= {"md5sum": "0" * 32, "sha256": "0" * 64, **write_manifest_piece(plan, info["shard"], piece)}
        (folder / f"{name}.json").write_text(json.dumps(info))
        report = {"shard": info["shard"], "loader": "open_clip_train.data", "groups": piece_rows}
        report |= {"passed": piece_rows, "key_sum": int(shard_sums[s]), "decoded": 0, "problems": []}
        (folder / f"{name}.report.json").write_text(json.dumps(report))
        args["infos"].append(str(folder / f"{name}.json"))
        args["manifests"].append(str(piece))
        args["reports"].append(str(folder / f"{name}.report.json"))
    published = n["shards"] * piece_rows
    template = ledger_table(ledger_rows, "000000", rng)
    for p in range(n["parts"]):
        part = f"laion-{p:06d}"
        pq.write_table(template, folder / f"{part}.rejected.parquet")
        share = published // n["parts"] + (1 if p < published % n["parts"] else 0)
        pq.write_table(pa.table({"rid": np.arange(ledger_rows + share)}), folder / f"{part}.status.parquet")
        args["status"].append(str(folder / f"{part}.status.parquet"))
        args["rejected"].append(str(folder / f"{part}.rejected.parquet"))
    drops = ledger_table(drop_rows, "dropped", rng).to_pandas()
    drops["stage"], drops["reason"], drops["id"] = "shard", "duplicate_key", np.arange(drop_rows, dtype=np.int64)
    for g in range(n["groups"]):  # planning's ledger pieces, in the rule's order after the parts'
        path = folder / f"group-{g:06d}.dropped.parquet"
        pq.write_table(pa.Table.from_pandas(drops[LEDGER_PIECE], preserve_index=False), path)
        args["rejected"].append(str(path))
    for p, path in enumerate(args["status"]):  # the planning drops come out of the parts' records
        extra = n["groups"] * drop_rows // n["parts"] + (1 if p < n["groups"] * drop_rows % n["parts"] else 0)
        rows = pq.ParquetFile(path).metadata.num_rows + extra
        pq.write_table(pa.table({"rid": np.arange(rows)}), path)
    kept = rng.integers(0, 2**63, size=n["buckets"], dtype=np.int64).astype(object)
    kept[-1] = (int(sum(int(x) for x in shard_sums)) - int(sum(int(x) for x in kept[:-1]))) & MASK
    counts_kept = np.full(n["buckets"], published // n["buckets"])
    counts_kept[: published % n["buckets"]] += 1
    empty = [DROPS.empty_table()] * n["groups"]
    for b in range(n["buckets"]):
        path = folder / f"bucket-{b:06d}.drops.arrow"
        write_buckets(path, DROPS, empty, {"kept": int(counts_kept[b]), "key_sum": int(kept[b])})
        args["drops"].append(str(path))
    (folder / "args.json").write_text(json.dumps(args))
    return {**n, "published": published, "ledger_rows": n["parts"] * ledger_rows + n["groups"] * drop_rows}


def run_job(code: str) -> dict:
    """Peak RSS (MiB), CPU and wall seconds of `code` run in a fresh interpreter, as a Snakemake job runs."""
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", f"import resource, sys; sys.path.insert(0, {str(REPO)!r})\n{code}\n"
         "r = resource.getrusage(resource.RUSAGE_SELF)\n"
         "print('usage', r.ru_maxrss, r.ru_utime + r.ru_stime)"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    wall = time.perf_counter() - t0
    kib, cpu = done.stdout.split("usage")[-1].split()
    return {"peak_mib": round(int(kib) / 1024, 1), "cpu_s": round(float(cpu), 2), "wall_s": round(wall, 2)}


def index_jobs(args: Path, out: Path, run: Callable[[str], object], by_bucket: bool = True) -> dict:
    """index_shards and validate_dataset on the pieces `args` (JSON) names, each by `run` in a fresh
    interpreter; validation checks the keys by bucket (`drops`), or else sorts the manifest's into bins."""
    load = f"import json\na = json.load(open({str(args)!r}))\n"
    keys = (
        "manifest_path=None, planned=planned_keys(a['drops'], None)"
        if by_bucket
        else f"manifest_path={str(out / 'manifest.parquet')!r}"
    )
    return {
        "index_shards": run(
            f"{load}from shardsmith.formats.index import build_index\n"
            f"build_index('ds', a['infos'], a['manifests'], a['status'], a['rejected'], {str(out)!r})"
        ),
        "validate_dataset": run(
            f"{load}from shardsmith.shards.validate import check_dataset, planned_keys\n"
            f"check_dataset(a['reports'], {str(out / 'sizes.json')!r}, min_shards=1, {keys})"
        ),
    }


def measure(folder: Path, fraction: float, piece_rows: int, ledger_rows: int, drop_rows: int) -> dict:
    t0 = time.perf_counter()
    row = {"fraction": fraction, **generate(folder, fraction, piece_rows, ledger_rows, drop_rows)}
    row["generate_s"] = round(time.perf_counter() - t0, 1)
    out = folder / "index"
    row |= index_jobs(folder / "args.json", out, run_job)
    stats = json.loads((out / "stats.json").read_text())
    assert stats["published"] == row["published"] and stats["rejected"] == row["ledger_rows"], stats
    assert len(os.listdir(out / "manifest.parquet")) == row["shards"], "a manifest piece per shard"
    linked = (out / "manifest.parquet" / "ds-000000.parquet").stat().st_ino == Path(
        json.loads((folder / "args.json").read_text())["manifests"][0]
    ).stat().st_ino
    row["manifest_linked"] = linked
    return row


def extrapolate(rows: list[dict]) -> dict:
    """Each job's CPU fitted as a + b x fraction (two sizes), at each dataset's fraction of LAION-5B."""
    a, b = rows[0], rows[-1]
    out = {}
    for job in ("index_shards", "validate_dataset"):
        slope = (b[job]["cpu_s"] - a[job]["cpu_s"]) / (b["fraction"] - a["fraction"])
        base = a[job]["cpu_s"] - slope * a["fraction"]
        mem = (b[job]["peak_mib"] - a[job]["peak_mib"]) / (b["fraction"] - a["fraction"])
        mbase = a[job]["peak_mib"] - mem * a["fraction"]
        out[job] = {
            name: {
                "cpu_min": round((base + slope * samples / LAION_5B["samples"]) / 60, 2),
                "peak_gib": round((mbase + mem * samples / LAION_5B["samples"]) / 1024, 2),
            }
            for name, samples in DATASETS.items()
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fractions", type=float, nargs="+", default=[1 / 128, 1 / 32])
    ap.add_argument("--piece-rows", type=int, default=1000)
    ap.add_argument("--ledger-rows", type=int, default=100_000, help="rejections a part (40%% of 250,000)")
    ap.add_argument("--drop-rows", type=int, default=5_000, help="a planning group's drops (1%% of 500,000)")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "index-scale.json")
    a = ap.parse_args()
    rows = []
    for fraction in sorted(a.fractions):
        with tempfile.TemporaryDirectory(prefix="index-scale-") as tmp:
            rows.append(measure(Path(tmp) / "run", fraction, a.piece_rows, a.ledger_rows, a.drop_rows))
        print(json.dumps(rows[-1]), flush=True)
    target = {"cpu_min": 30, "peak_gib": 2}
    at_5b = extrapolate(rows)
    met = all(
        at_5b[j]["LAION-5B"]["cpu_min"] <= target["cpu_min"] and at_5b[j]["LAION-5B"]["peak_gib"] <= target["peak_gib"]
        for j in at_5b
    )
    result = {
        "what": "index_shards and validate_dataset from pieces, each in a fresh interpreter, at fractions of "
        "LAION-5B's shards, parts, groups, buckets and ledger rows (recommended sizes)",
        "piece_rows": a.piece_rows,
        "ledger_rows_per_part": a.ledger_rows,
        "drop_rows_per_group": a.drop_rows,
        "rows": rows,
        "extrapolated": at_5b,
        "target": {**target, "met_at_laion_5b": met},
    }
    save_result(a.out, result)
    print(json.dumps(at_5b, indent=1))


if __name__ == "__main__":
    main()
