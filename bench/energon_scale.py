"""Megatron-Energon's metadata at LAION scale: write_energon_meta (every build) and write_energon_sqlite (only
where `loaders.energon_sqlite` asks for it), each at two sizes, extrapolated to CC12M, LAION-400M and LAION-5B.

    python bench/energon_scale.py [--shards 4000 16000] [--samples 250000 1000000]

write_energon_meta reads write_shard's info file of every shard (`--shards` of them, generated: 50,000
samples and a sha256 each) and writes `.nv-meta/` but the index: its work grows with the shards.
write_energon_sqlite reads every shard's member table (`--samples` samples in shards of 10,000, three
members each, written with shardsmith.shards.write.write_members as write_shard writes them) and fills
index.sqlite: its work grows with the samples. Each runs as its rule runs it (the same library calls under
shardsmith.core.logs.run_job, which logs the job's peak memory and CPU) in a fresh interpreter. CPU time and
the index's bytes are fitted as a + b x size through the two points, and so is the meta job's memory (it
holds a count a shard); the index job's memory is bounded (a shard's members at a time, SQLite's sorts
spilled to temporary files): the larger point's. Extrapolated with the recommended sizes (docs/sizing.md):
CC12M 1,243 shards of 10,000, LAION-400M 8,278 of 50,000, LAION-5B 117,000 of 50,000.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from bench.e2e_bench import save_result  # noqa: E402
from shardsmith.formats.tario import TarMember  # noqa: E402
from shardsmith.shards.write import write_members  # noqa: E402

DATASETS = {"CC12M": (12_423_374, 10_000), "LAION-400M": (413_871_335, 50_000), "LAION-5B": (5_850_000_000, 50_000)}
SHARD_SAMPLES = 10_000  # of the generated member tables
_RESOURCES = re.compile(r"^resources: peak_rss_mib=([\d.]+) child_peak_rss_mib=([\d.]+) cpu_s=([\d.]+)", re.M)

META_JOB = """
import json, sys
from pathlib import Path
from shardsmith.core.logs import run_job
from shardsmith.formats.energon import write_meta
infos, out, log = sys.argv[1:4]

def main():
    files = sorted(Path(infos).glob("*.json"))
    shards = ((i["shard"], i["nsamples"], i["sha256"]) for i in (json.loads(p.read_text()) for p in files))
    write_meta(out, shards)

run_job(log, main)
"""
SQLITE_JOB = """
import sys
from pathlib import Path
from shardsmith.core.logs import run_job
from shardsmith.formats.energon import write_sqlite
from shardsmith.shards.write import read_members
members, out, log = sys.argv[1:4]

def main():
    tables = sorted(Path(members).glob("*.members.parquet"))
    write_sqlite(out, ((p.name.removesuffix(".members.parquet") + ".tar", read_members(p)) for p in tables))

run_job(log, main)
"""


def _job(code: str, inputs: Path, out: Path) -> dict:
    log = out / "job.log"
    subprocess.run([sys.executable, "-c", code, str(inputs), str(out), str(log)], check=True, cwd=REPO)
    peak, _, cpu = (float(x) for x in _RESOURCES.findall(log.read_text())[-1])
    return {"peak_mib": peak, "cpu_s": cpu}


def measure_meta(shards: int, work: Path) -> dict:
    infos = work / "infos"
    infos.mkdir(parents=True)
    for i in range(shards):
        info = {"shard": f"ds-{i:06d}.tar", "nsamples": 50_000, "sha256": f"{i:064x}", "filesize": 2**30}
        (infos / f"ds-{i:06d}.json").write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
    got = _job(META_JOB, infos, work)
    return {"shards": shards, **got}


def measure_sqlite(samples: int, work: Path) -> dict:
    tables = work / "members"
    tables.mkdir(parents=True)
    for s, start in enumerate(range(0, samples, SHARD_SAMPLES)):
        members, offset = [], 0
        for k in range(start, min(samples, start + SHARD_SAMPLES)):
            key = f"src-{k:09d}"
            for ext, size in (("jpg", 40_000 + k % 9_000), ("txt", 60 + k % 90), ("json", 300 + k % 50)):
                members.append(TarMember(key, ext, offset + 512, size))
                offset += 512 + -(-size // 512) * 512
        write_members(tables / f"ds-{s:06d}.members.parquet", members)
    got = _job(SQLITE_JOB, tables, work)
    return {"samples": samples, **got, "sqlite_bytes": (work / ".nv-meta" / "index.sqlite").stat().st_size}


def _line(a: dict, b: dict, by: str, key: str, x: float) -> float:
    slope = (b[key] - a[key]) / (b[by] - a[by])
    return b[key] + max(0.0, slope) * (x - b[by])


def extrapolate(meta: list[dict], sqlite: list[dict]) -> dict:
    out = {}
    for name, (samples, per_shard) in DATASETS.items():
        shards = -(-samples // per_shard)
        a, b = meta[0], meta[-1]
        s, t = sqlite[0], sqlite[-1]
        out[name] = {
            "samples": samples,
            "shards": shards,
            "write_energon_meta": {
                "cpu_min": round(_line(a, b, "shards", "cpu_s", shards) / 60, 2),
                "peak_mib": round(_line(a, b, "shards", "peak_mib", shards)),
            },
            "write_energon_sqlite": {
                "cpu_h": round(_line(s, t, "samples", "cpu_s", samples) / 3600, 2),
                "peak_mib": round(max(s["peak_mib"], t["peak_mib"])),
                "sqlite_gb": round(_line(s, t, "samples", "sqlite_bytes", samples) / 1e9, 1),
            },
        }
    return out


def _in_scratch(measure, size: int, prefix: str) -> dict:
    """One measurement in a folder of its own, removed after it."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        got = measure(size, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(got, flush=True)
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shards", type=int, nargs=2, default=[4_000, 16_000])
    ap.add_argument("--samples", type=int, nargs=2, default=[250_000, 1_000_000])
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "energon-scale.json")
    a = ap.parse_args()
    meta = [_in_scratch(measure_meta, n, "energon-meta-") for n in a.shards]
    sqlite = [_in_scratch(measure_sqlite, n, "energon-sqlite-") for n in a.samples]
    per = sqlite[-1]
    result = {
        "bench": "energon_scale",
        "write_energon_meta": meta,
        "write_energon_sqlite": sqlite,
        "sqlite_per_sample": {
            "cpu_us": round((per["cpu_s"] - sqlite[0]["cpu_s"]) / (per["samples"] - sqlite[0]["samples"]) * 1e6, 1),
            "bytes": round((per["sqlite_bytes"] - sqlite[0]["sqlite_bytes"]) / (per["samples"] - sqlite[0]["samples"])),
        },
        "extrapolated": extrapolate(meta, sqlite),
    }
    save_result(a.out, result)
    print(json.dumps(result["extrapolated"], indent=1))


if __name__ == "__main__":
    main()
