"""Publishing to S3: what upload and each verification mode cost, against moto_server on loopback.

    python bench/publish_bench.py [--big 8x32] [--small 200x100] [--repeat 2]

Two datasets: a few large shards (transfer-bound) and many small objects (bound by per-object and per-CLI
overhead). For each: `aws s3 sync` upload, verification by reading back (one `aws s3 cp --recursive` per
batch), verification by ETags, and, for comparison, reading back with one `aws s3 cp URL -` per object
(the first design). Best of `repeat`. moto keeps objects in memory and is far slower than real S3 per
request, so the ratios matter more than the absolute times. Results go to bench/results/publish.json.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
from servers import aws_cli, free_port, wait_for_port  # noqa: E402

from shardsmith.formats.tario import hash_file  # noqa: E402
from shardsmith.publish.contents import file_table  # noqa: E402
from shardsmith.publish.dataset import PublishSettings  # noqa: E402
from shardsmith.publish.s3 import verify_s3  # noqa: E402
from shardsmith.storage.s3 import S3Settings, open_stream, run  # noqa: E402
from shardsmith.storage.stores import S3Store  # noqa: E402


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def per_object_readback(store: S3Store, version: str, names: list[str]) -> None:
    for name in names:
        with open_stream(f"{store.where(version)}/{name}", store.s3) as f:
            while f.read(1 << 20):
                pass


def case(label: str, count: int, size: int, s3: S3Settings, repeat: int, per_object: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        for i in range(count):
            p = Path(tmp, f"bench-{i:06d}.tar")
            p.write_bytes(os.urandom(size))
            paths.append(str(p))
        table = file_table(paths)
        by_name = {Path(p).name: p for p in paths}
        bucket = f"bench-{label}-{os.getpid()}"
        run(s3, "s3", "mb", f"s3://{bucket}")
        store = S3Store(f"s3://{bucket}/x", "ds", s3)
        upload = best(
            lambda: run(s3, "s3", "sync", "--only-show-errors", tmp + "/", store.where("v1") + "/", timeout=None), 1
        )
        result = {"objects": count, "bytes": count * size, "upload_s": round(upload, 2)}
        for mode in ("readback", "etag"):
            settings = PublishSettings(verify=mode)
            t = best(lambda settings=settings: verify_s3(store, "v1", table, by_name, settings), repeat)
            assert not verify_s3(store, "v1", table, by_name, settings)
            result[f"verify_{mode}_s"] = round(t, 2)
        result["local_sha256_s"] = round(best(lambda: [hash_file(p) for p in paths], repeat), 2)
        if per_object:
            result["readback_one_cli_per_object_s"] = round(
                best(lambda: per_object_readback(store, "v1", list(table)), 1), 2
            )
        run(s3, "s3", "rb", "--force", f"s3://{bucket}")
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--big", default="8x32", help="COUNTxMiB of the large-shard case")
    ap.add_argument("--small", default="200x100", help="COUNTxKiB of the many-objects case")
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    server = Path(sys.executable).parent / "moto_server"
    port = free_port()
    env = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench-secret", "AWS_DEFAULT_REGION": "us-east-1"}
    os.environ.update(env)
    proc = subprocess.Popen(
        [str(server), "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_for_port(port)
        s3 = S3Settings(endpoint_url=f"http://127.0.0.1:{port}", aws_cli=aws_cli() or "aws", region="us-east-1")
        n, mib = map(int, a.big.split("x"))
        m, kib = map(int, a.small.split("x"))
        results = {
            "machine": {
                "python": platform.python_version(),
                "cpus": os.cpu_count(),
                "aws": subprocess.run([s3.aws_cli, "--version"], capture_output=True, text=True).stdout.strip(),
            },
            "large_shards": case("big", n, mib * 1024**2, s3, a.repeat, per_object=False),
            "many_objects": case("small", m, kib * 1024, s3, a.repeat, per_object=True),
        }
    finally:
        proc.terminate()
        proc.wait(10)
    out = ROOT / "bench" / "results" / "publish.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
