"""Publishing a version to S3 through the AWS CLI: one `aws s3 sync`, verification by size and read-back
(or ETags), what did not verify sent again, then the marker, the commit point (S3 has no rename)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from shardsmith.core.atomic import hash_file, sha256_file
from shardsmith.publish.contents import changed, conflict
from shardsmith.publish.settings import PublishSettings
from shardsmith.storage.s3 import S3Settings, redact, run
from shardsmith.storage.stores import MARKER, PublishError, S3Store

_MiB = 1024**2
_SIZE_SUFFIX = {
    "kb": 1024,
    "mb": _MiB,
    "gb": 1024**3,
    "tb": 1024**4,
    "kib": 1024,
    "mib": _MiB,
    "gib": 1024**3,
    "tib": 1024**4,
}
_NO_TIMEOUT = None  # uploads of a large dataset take as long as they take; the CLI retries by itself


def human_bytes(value: int | str) -> int:
    """Bytes of an AWS CLI size setting: 8388608, '8MB', '64MiB' (MB = MiB, as the CLI reads it)."""
    if isinstance(value, int):
        return value
    text = value.strip().lower()
    for suffix in sorted(_SIZE_SUFFIX, key=len, reverse=True):
        if text.endswith(suffix):
            return int(text[: -len(suffix)]) * _SIZE_SUFFIX[suffix]
    return int(text)


def expected_etag(path: str | os.PathLike, threshold: int = 8 * _MiB, chunksize: int = 8 * _MiB) -> str:
    """The ETag S3 gives a file uploaded by the AWS CLI: md5, or md5 of the part md5s + '-N' for multipart.

    Mirrors s3transfer: multipart from `threshold` bytes on, parts of `chunksize`, doubled until at most
    10000 parts, then kept within 5 MiB..5 GiB. Only a hint: a mismatch (SSE-KMS, another part size) is
    settled by reading the object back.
    """
    size = os.path.getsize(path)
    if size < threshold:
        return hash_file(path, ("md5",))["md5"]
    while math.ceil(size / chunksize) > 10_000:
        chunksize *= 2
    chunksize = min(max(chunksize, 5 * _MiB), 5 * 1024**3)  # S3's part size limits
    digests = []
    with open(path, "rb") as f:
        while block := f.read(chunksize):
            digests.append(hashlib.md5(block).digest())
    return f"{hashlib.md5(b''.join(digests)).hexdigest()}-{len(digests)}"


READBACK_BATCH_BYTES = 2 * 1024**3  # local scratch used at once while reading back


def _batches(
    names: list[str], table: dict[str, dict], limit: int = READBACK_BATCH_BYTES, most: int = 500
) -> Iterator[list[str]]:
    batch: list[str] = []
    size = 0
    for name in names:
        if batch and (size + table[name]["size"] > limit or len(batch) >= most):
            yield batch
            batch, size = [], 0
        batch.append(name)
        size += table[name]["size"]
    if batch:
        yield batch


def read_back(store: S3Store, version: str, names: list[str], table: dict[str, dict]) -> dict[str, dict]:
    """{name: {size, sha256}} of objects as the destination returns them (size -1 when absent).

    One `aws s3 cp --recursive` per batch of up to 2 GiB into a private scratch folder (the CLI downloads
    in parallel; starting it once per object cost about 1 s of CPU each), hashed and deleted batch by batch.
    """
    got: dict[str, dict] = {}
    url = store.where(version) + "/"
    with tempfile.TemporaryDirectory(prefix="shardsmith-readback-") as tmp:
        for batch in _batches(names, table):
            filters = [arg for name in batch for arg in ("--include", name)]
            run(
                store.s3,
                "s3",
                "cp",
                "--recursive",
                "--only-show-errors",
                url,
                tmp,
                "--exclude",
                "*",
                *filters,
                timeout=_NO_TIMEOUT,
            )
            for name in batch:
                path = Path(tmp, name)
                if path.is_file():
                    got[name] = {"size": path.stat().st_size, "sha256": sha256_file(path)}
                    path.unlink()
                else:
                    got[name] = {"size": -1, "sha256": ""}
    return got


def verify_s3(
    store: S3Store,
    version: str,
    table: dict[str, dict],
    paths: dict[str, str],
    settings: PublishSettings,
    objects: dict[str, dict] | None = None,
) -> dict[str, str]:
    """{name: problem} for every file that is not on the destination as sent ({} when all are).

    `objects`: {name: {size, etag}} listed by the caller (a batch lists its own range of keys); by default
    the whole version is listed, and an object that is not part of it is a problem too.
    """
    strays = objects is None
    if objects is None:
        objects, _ = store.listing(store.where(version) + "/")
    problems = {n: "missing" for n in table if n not in objects}
    problems |= {
        n: f"size {objects[n]['size']} != {e['size']}"
        for n, e in table.items()
        if n in objects and objects[n]["size"] != e["size"]
    }
    if strays:
        problems |= {n: "not part of this version" for n in objects if n not in table and n != MARKER}
    todo = [n for n in table if n not in problems]
    if settings.verify == "etag":
        threshold = human_bytes(settings.multipart_threshold or 8 * _MiB)
        chunksize = human_bytes(settings.multipart_chunksize or 8 * _MiB)
        todo = [n for n in todo if objects[n]["etag"] != expected_etag(paths[n], threshold, chunksize)]
    got = read_back(store, version, todo, table) if todo else {}
    problems |= {n: f"read back {g['size']} bytes, sha256 {g['sha256'][:12]}" for n, g in got.items() if g != table[n]}
    return problems


def mend(
    store: S3Store,
    version: str,
    table: dict[str, dict],
    by_name: dict[str, str],
    settings: PublishSettings,
    problems: dict[str, str],
    verify: Callable[[], dict[str, str]],
) -> None:
    """Send again, one file at a time, what did not verify (twice at most), removing objects that are not part
    of the version; PublishError naming what still does not verify (a source changed since it was hashed
    first)."""
    url = store.where(version) + "/"
    for _ in range(2):  # what sync skipped or the store mangled is sent again, one file at a time
        if not problems:
            break
        print(
            f"re-sending {len(problems)} files that did not verify: "
            + "; ".join(f"{n}: {p}" for n, p in sorted(problems.items())[:5])
        )
        for name in problems:
            if name in by_name:
                run(store.s3, "s3", "cp", "--only-show-errors", by_name[name], url + name, timeout=_NO_TIMEOUT)
            else:
                run(store.s3, "s3", "rm", "--only-show-errors", url + name)
        problems = verify()
    for name in sorted(n for n in problems if n in by_name):  # a source changed since it was hashed
        if sha256_file(by_name[name]) != table[name]["sha256"]:
            raise PublishError(changed(name, by_name[name]))
    if problems:
        raise PublishError(
            f"{url} does not hold what was sent: " + "; ".join(f"{n}: {p}" for n, p in sorted(problems.items())[:10])
        )


@contextlib.contextmanager
def cli_config(settings: PublishSettings, s3: S3Settings) -> Iterator[None]:
    """Multipart settings for the AWS CLI, set with `aws configure set` in a private copy of the user's
    config file (AWS_CONFIG_FILE for this process only); the user's ~/.aws is never written."""
    values = settings.cli_config()
    if not values:
        yield
        return
    tmp = tempfile.mkdtemp(prefix="shardsmith-aws-")  # 0700
    copy = Path(tmp, "config")
    source = Path(os.environ.get("AWS_CONFIG_FILE") or Path.home() / ".aws" / "config")
    if source.is_file():
        shutil.copyfile(source, copy)
    else:
        copy.touch()
    os.chmod(copy, 0o600)
    old = os.environ.get("AWS_CONFIG_FILE")
    os.environ["AWS_CONFIG_FILE"] = str(copy)
    try:
        exe = shutil.which(s3.aws_cli) or s3.aws_cli
        profile = ["--profile", s3.profile] if s3.profile else []
        for key, value in values.items():
            proc = subprocess.run(
                [exe, "configure", "set", f"s3.{key}", value, *profile], capture_output=True, text=True
            )
            if proc.returncode:
                raise PublishError(f"aws configure set s3.{key} {value}: {redact(proc.stderr.strip())}")
        yield
    finally:
        if old is None:
            os.environ.pop("AWS_CONFIG_FILE", None)
        else:
            os.environ["AWS_CONFIG_FILE"] = old
        shutil.rmtree(tmp, ignore_errors=True)


def publish_s3(
    named: dict[str, str],
    table: dict,
    store: S3Store,
    version: str,
    marker: dict,
    old: dict | None,
    settings: PublishSettings,
) -> dict:
    if old is not None:
        if old["files"] != table:
            raise conflict(store.where(version), version)
        return old
    by_name = {name: os.path.abspath(p) for name, p in named.items()}
    url = store.where(version) + "/"
    total = sum(e["size"] for e in table.values())
    with cli_config(settings, store.s3), tempfile.TemporaryDirectory(prefix="shardsmith-publish-") as stage:
        for name, path in by_name.items():
            Path(stage, name).parent.mkdir(parents=True, exist_ok=True)  # .nv-meta/x: the key {version}/.nv-meta/x
            os.symlink(path, Path(stage, name))  # sync follows links: one CLI run, parallel multipart uploads
        started = time.monotonic()
        # --delete: objects of an earlier killed attempt that are not part of this content go away
        run(store.s3, "s3", "sync", "--only-show-errors", "--delete", stage + "/", url, timeout=_NO_TIMEOUT)
        print(f"uploaded {len(table)} files ({total / 1e6:.1f} MB) to {url} in {time.monotonic() - started:.1f} s")
        started = time.monotonic()
        check = lambda: verify_s3(store, version, table, by_name, settings)  # noqa: E731
        mend(store, version, table, by_name, settings, check(), check)
        how = "ETags (reading back mismatches)" if settings.verify == "etag" else f"reading back {total / 1e6:.1f} MB"
        print(f"verified {len(table)} objects by size and {how} in {time.monotonic() - started:.1f} s")
    store.upload_bytes(
        f"{version}/{MARKER}",
        (json.dumps(marker, indent=1, sort_keys=True) + "\n").encode(),
        "--content-type",
        "application/json",
    )
    return marker
