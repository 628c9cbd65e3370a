"""Publishing spread over jobs (shardsmith.publish.staged): an upload job's time per shard, and the commit's
time against the version's size, on a mounted path (copies, as to another file system) and on S3
(moto_server on loopback, the real AWS CLI).

    python bench/publish_scale.py [--shards 32,128] [--shard-mib 2] [--shards-per-job 16]

For each size: plan_version, then every upload_batch (as upload_shards jobs run them, one after another
here), then commit_version. Reported: each upload job's wall time and its time per shard (placing or sending
plus verification: read back and hashed), the commit's wall time, and the time of the one listing it makes
(os.walk of the staging folder; list-objects-v2 of the version prefix). A commit that grows only with its
listing keeps commit - listing flat across sizes. Results go to bench/results/publish-scale.json.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from servers import aws_cli, free_port, wait_for_port  # noqa: E402

from shardsmith.publish.settings import PublishSettings  # noqa: E402
from shardsmith.publish.staged import commit_version, plan_version, staging_dir, upload_batch  # noqa: E402
from shardsmith.storage.s3 import S3Settings, run  # noqa: E402
from shardsmith.storage.stores import LocalStore, S3Store, open_store  # noqa: E402

COPY = PublishSettings(hardlink=False)  # a copy, as to fast storage on another file system


def make_dataset(folder: Path, shards: int, shard_bytes: int) -> list[str]:
    """Shards with their two loader indexes (about 1% and 0.2% of a shard) and a few dataset-wide files."""
    folder.mkdir(parents=True)
    for i in range(shards):
        (folder / f"ds-{i:06d}.tar").write_bytes(os.urandom(shard_bytes))
        (folder / f"ds-{i:06d}.idx").write_bytes(os.urandom(shard_bytes // 100))
        (folder / f"ds-{i:06d}.tar.idx").write_bytes(os.urandom(shard_bytes // 500))
    for name in ("sizes.json", "stats.json", "validation.json", "wids-index.json"):
        (folder / name).write_bytes(os.urandom(4096))
    return sorted(str(p) for p in folder.iterdir())


def listing_seconds(store, version: str) -> float:
    started = time.perf_counter()
    if isinstance(store, S3Store):
        store.listing(store.where(version) + "/")
    else:
        folder = Path(store.where(version))
        sum(len(files) for _, _, files in os.walk(folder))
    return time.perf_counter() - started


def case(dest: str, shards: int, shard_bytes: int, per_job: int, s3: S3Settings | None) -> dict:
    with tempfile.TemporaryDirectory(dir=ROOT / "bench") as tmp:
        files = make_dataset(Path(tmp, "out"), shards, shard_bytes)
        batches = -(-shards // per_job)
        started = time.perf_counter()
        plan, runs = plan_version(files, dest, "ds", "v1", batches, COPY, s3, names_from=Path(tmp, "out"))
        plan_s = time.perf_counter() - started
        jobs, receipts, after = [], [], None
        for batch in runs:
            started = time.perf_counter()
            receipts.append(upload_batch(plan, batch, after, COPY, s3))
            seconds = time.perf_counter() - started
            held = sum(n.endswith(".tar") for n in batch)
            jobs.append({"files": len(batch), "shards": held, "seconds": round(seconds, 3)})
            after = max(batch, default=after)
        store = open_store(dest, "ds", s3)
        started = time.perf_counter()
        commit_version(plan, receipts, COPY, s3)
        commit_s = time.perf_counter() - started
        per_shard = [j["seconds"] / j["shards"] for j in jobs if j["shards"]]
        result = {
            "shards": shards,
            "files": len(files),
            "bytes": sum(os.path.getsize(f) for f in files),
            "upload_jobs": len(jobs),
            "plan_s": round(plan_s, 3),
            "upload_job_s": [j["seconds"] for j in jobs],
            "upload_s_per_shard_median": round(statistics.median(per_shard), 4),
            "commit_s": round(commit_s, 3),
            "listing_s": round(listing_seconds(store, "v1"), 3),
        }
        if isinstance(store, LocalStore):
            assert not staging_dir(store, "v1").exists()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shards", default="32,128", help="dataset sizes, in shards")
    ap.add_argument("--shard-mib", type=float, default=2.0)
    ap.add_argument("--shards-per-job", type=int, default=16)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "publish-scale.json"))
    a = ap.parse_args()
    sizes = [int(s) for s in a.shards.split(",")]
    shard_bytes = int(a.shard_mib * 1024**2)
    env = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench-secret", "AWS_DEFAULT_REGION": "us-east-1"}
    os.environ.update(env)
    port = free_port()
    server = Path(sys.executable).parent / "moto_server"
    proc = subprocess.Popen(
        [str(server), "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    results: dict = {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "shard_bytes": shard_bytes,
        "shards_per_job": a.shards_per_job,
        "mounted": [],
        "s3": [],
    }
    try:
        wait_for_port(port)
        s3 = S3Settings(endpoint_url=f"http://127.0.0.1:{port}", aws_cli=aws_cli() or "aws", region="us-east-1")
        results["machine"]["aws"] = subprocess.run(
            [s3.aws_cli, "--version"], capture_output=True, text=True
        ).stdout.strip()
        for shards in sizes:
            with tempfile.TemporaryDirectory(dir=ROOT / "bench") as fast:
                r = case(fast, shards, shard_bytes, a.shards_per_job, None)
            results["mounted"].append(r)
            print("mounted", json.dumps(r), flush=True)
            bucket = f"bench-scale-{shards}-{os.getpid()}"
            run(s3, "s3", "mb", f"s3://{bucket}")
            r = case(f"s3://{bucket}/x", shards, shard_bytes, a.shards_per_job, s3)
            run(s3, "s3", "rb", "--force", f"s3://{bucket}")
            results["s3"].append(r)
            print("s3", json.dumps(r), flush=True)
    finally:
        proc.terminate()
        proc.wait(10)
    Path(a.out).parent.mkdir(exist_ok=True)
    Path(a.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
