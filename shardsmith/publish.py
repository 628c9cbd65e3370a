"""Publish a validated dataset to fast storage, `{dest}/{dataset}/{version}/`, then the `latest` pointer.

`dest` is a mounted path (NFS, Lustre, local NVMe) or `s3://bucket/prefix` (any S3-compatible store, through
the AWS CLI). Either way a version is committed by its completion marker `_COMPLETE.json`, which lists every
file's size and sha256 and is written only after the files were verified on the destination; `latest` is
written after the marker. A reader that follows `latest` never sees a partial version, and a publish killed
at any point leaves `latest` on the previous complete version.

- Mounted path: the version is assembled in a temporary folder (hard links where the file system allows,
  else copies flushed to disk), read back, then renamed into place.
- S3 has no rename, so the marker is the commit point: objects are uploaded into the version prefix
  (`aws s3 sync`), listed and read back (or checked against their ETags), then the marker goes up, then
  `latest`. Readers and validators must treat a version without a marker as absent: use
  `complete_versions`, `latest_version` and `read_complete` (shardsmith.stores) rather than listing the prefix.

Publishing the same content under the same version again is a no-op; different content under an existing
version is refused (PublishConflict). `version: auto` names a new version `{UTC date}-{content fingerprint}`
and publishes nothing when the content equals what `latest` names. Optional retention keeps the newest N
complete versions, never the one `latest` names. Credentials come only from the usual AWS environment;
messages pass through `shardsmith.s3.redact`.
"""

import argparse
import contextlib
import datetime as dt
import errno
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from pathlib import Path

from shardsmith.build import BUILD_INFO
from shardsmith.s3 import S3Error, S3Settings, redact, run
from shardsmith.stores import (
    LATEST,
    MARKER,
    LocalStore,
    PublishError,
    S3Store,
    Store,
    by_age,
    complete_versions,
    latest_version,
    open_store,
)
from shardsmith.tario import atomic_write_text, hash_file, sha256_file

AUTO = "auto"
CARD = "README.md"  # the dataset card (shardsmith.card): its title names the version
DESCRIBES_THE_BUILD = (BUILD_INFO, CARD)  # not data: left out of the content fingerprint
VERIFY_MODES = ("readback", "etag")
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


class PublishConflict(RuntimeError):
    """Different content under a version that is already published."""


@dataclass(frozen=True)
class PublishSettings:
    """The `publish` config section, minus `dest` and `dedupe` (see the schema for each key)."""

    keep_versions: int | None = None
    verify: str = "readback"
    multipart_threshold: int | str | None = None
    multipart_chunksize: int | str | None = None
    max_concurrent_requests: int | None = None
    hardlink: bool = True

    @classmethod
    def from_config(cls, section: dict) -> "PublishSettings":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in section.items() if k in names})

    def cli_config(self) -> dict[str, str]:
        """AWS CLI `s3` settings to set (only those given)."""
        keys = ("multipart_threshold", "multipart_chunksize", "max_concurrent_requests")
        return {k: str(getattr(self, k)) for k in keys if getattr(self, k) is not None}


def human_bytes(value: int | str) -> int:
    """Bytes of an AWS CLI size setting: 8388608, '8MB', '64MiB' (MB = MiB, as the CLI reads it)."""
    if isinstance(value, int):
        return value
    text = value.strip().lower()
    for suffix in sorted(_SIZE_SUFFIX, key=len, reverse=True):
        if text.endswith(suffix):
            return int(text[: -len(suffix)]) * _SIZE_SUFFIX[suffix]
    return int(text)


# --- what is published ---------------------------------------------------------------------------


def publish_names(paths: list[str], names_from: str | os.PathLike | None = None) -> dict[str, str]:
    """{name in the version: path} of the files to publish, sorted by name.

    A file's name is its basename, or with `names_from` its path relative to that folder when it lies
    inside it: `.nv-meta/index.sqlite` is published as that sub-folder and file of the version (on S3, that
    key below the version prefix). Names are relative, with `/` between parts and no `.` or `..` part.
    """
    base = Path(os.path.abspath(names_from)) if names_from is not None else None
    named: dict[str, str] = {}
    for p in paths:
        where = Path(os.path.abspath(p))
        name = where.relative_to(base).as_posix() if base is not None and where.is_relative_to(base) else where.name
        if name in named:
            raise ValueError("two files to publish share a name")
        named[name] = p
    for name in named:
        parts = name.split("/")
        if any(part in ("", ".", "..") for part in parts) or "\\" in name:
            raise ValueError(f"{name!r} cannot be published: names are relative paths without '.' or '..' parts")
    if any(
        name.rsplit("/", 1)[-1] in (MARKER, LATEST) for name in named
    ):  # in a sub-folder too: S3 state reads */MARKER
        raise ValueError(f"{MARKER} and {LATEST} are written by publishing, not published from the inputs")
    return dict(sorted(named.items()))


def file_table(
    paths: list[str], known: dict[str, dict] | None = None, names_from: str | os.PathLike | None = None
) -> dict[str, dict]:
    """{name: {size, sha256}} of the files to publish, sorted by name (publish_names names them).

    `known` gives {size, sha256} recorded when a file was written (write_shard hashes every shard): such a
    file is not read and hashed a second time. Only a publish that reads back what lands on the destination
    and checks it against these hashes may pass them (see publish); a file whose size is no longer the
    recorded one is refused here.
    """
    known = known or {}
    table = {}
    for name, p in publish_names(paths, names_from).items():
        size, recorded = os.path.getsize(p), known.get(name)
        if recorded and recorded["size"] != size:
            raise PublishError(_changed(name, p))
        table[name] = {"size": size, "sha256": recorded["sha256"] if recorded else sha256_file(p)}
    return table


def _changed(name: str, source: str | os.PathLike) -> str:
    return (
        f"{name}: changed since it was written and hashed ({source}); remove it, or run snakemake with "
        "--forcerun for the rule that writes it, to write it again"
    )


def _mismatch(name: str, source: str | os.PathLike, want: dict, got: str) -> str:
    """Why a file on the destination differs: the source changed since it was hashed, or the copy is bad."""
    if sha256_file(source) != want["sha256"]:
        return _changed(name, source)
    return f"{name}: {got}, which does not match the source ({want['size']} bytes, sha256 {want['sha256'][:12]})"


def content_fingerprint(table: dict[str, dict]) -> str:
    """sha256 of the published data (names and sha256s), without build.json and the card: same data, same
    fingerprint, whatever the version is called and wherever it was built."""
    data = {name: entry["sha256"] for name, entry in sorted(table.items()) if name not in DESCRIBES_THE_BUILD}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def same_data(a: dict[str, dict], b: dict[str, dict]) -> bool:
    return content_fingerprint(a) == content_fingerprint(b)


def auto_version(table: dict[str, dict], now: dt.datetime) -> str:
    """`{UTC date}-{first 8 hex of the content fingerprint}`: sorts by date, differs when the data differs."""
    return f"{now.astimezone(dt.UTC):%Y-%m-%d}-{content_fingerprint(table)[:8]}"


# --- verification on S3 --------------------------------------------------------------------------


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


def read_back(store: "S3Store", version: str, names: list[str], table: dict[str, dict]) -> dict[str, dict]:
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
    store: "S3Store", version: str, table: dict[str, dict], paths: dict[str, str], settings: PublishSettings
) -> dict[str, str]:
    """{name: problem} for every file that is not on the destination as sent ({} when all are)."""
    objects, _ = store.listing(store.where(version) + "/")
    problems = {n: "missing" for n in table if n not in objects}
    problems |= {
        n: f"size {objects[n]['size']} != {e['size']}"
        for n, e in table.items()
        if n in objects and objects[n]["size"] != e["size"]
    }
    problems |= {n: "not part of this version" for n in objects if n not in table and n != MARKER}
    todo = [n for n in table if n not in problems]
    if settings.verify == "etag":
        threshold = human_bytes(settings.multipart_threshold or 8 * _MiB)
        chunksize = human_bytes(settings.multipart_chunksize or 8 * _MiB)
        todo = [n for n in todo if objects[n]["etag"] != expected_etag(paths[n], threshold, chunksize)]
    got = read_back(store, version, todo, table) if todo else {}
    problems |= {n: f"read back {g['size']} bytes, sha256 {g['sha256'][:12]}" for n, g in got.items() if g != table[n]}
    return problems


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


# --- publishing ----------------------------------------------------------------------------------


def _conflict(where: str, version: str) -> PublishConflict:
    return PublishConflict(
        f"{where} is already published with different content; choose a new version (config: version, "
        f"or version: auto) instead of overwriting what readers may be training from. "
        f"The files of {version} are listed in {where}/{MARKER}."
    )


def _publish_local(
    by_name: dict[str, str],
    table: dict,
    store: LocalStore,
    version: str,
    marker: dict,
    old: dict | None,
    hardlink: bool,
    threads: int,
) -> dict:
    final = Path(store.where(version))
    if final.exists():
        if old is None or old["files"] != table:
            raise _conflict(str(final), version)
        return old
    Path(store.root).mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{version}.", suffix=".partial", dir=store.root))
    readable = 0o666 & ~_umask()  # read before the pool starts: reading os.umask sets it for the whole process
    folders = sorted({tmp / name.rsplit("/", 1)[0] for name in table if "/" in name})  # .nv-meta/
    try:
        for folder in folders:
            folder.mkdir(parents=True, exist_ok=True)
        # Files in parallel: copies to NFS or Lustre gain from several streams, and hashing (which releases
        # the GIL) from several cores.
        with ThreadPoolExecutor(max(1, threads)) as pool:
            placed = {name: pool.submit(_place, by_name[name], tmp / name, hardlink, readable) for name in table}
            try:
                linked = 0
                for name, want in table.items():  # read back what landed on the destination
                    got, was_linked = placed[name].result()
                    if got != want:
                        found = f"the file on {store.dest} has {got['size']} bytes with sha256 {got['sha256'][:12]}"
                        raise PublishError(_mismatch(name, by_name[name], want, found))
                    linked += was_linked
            except BaseException:
                pool.shutdown(cancel_futures=True)
                raise
        print(f"{len(table)} files in place and read back: {linked} hard-linked, {len(table) - linked} copied")
        for folder in folders:
            _fsync_dir(folder)
        _fsync_dir(tmp)  # the files' entries before the marker's
        atomic_write_text(tmp / MARKER, json.dumps(marker, indent=1, sort_keys=True) + "\n")
        os.chmod(tmp, 0o777 & ~_umask())
        os.rename(tmp, final)
        _fsync_dir(store.root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return marker


# os.link fails with these where a copy still works: another file system, links not supported or not allowed
_NO_LINK = frozenset(
    {errno.EXDEV, errno.EPERM, errno.EACCES, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS}
)


def _place(src: str, dst: Path, hardlink: bool, readable: int) -> tuple[dict, bool]:
    """Put `src` at `dst`; returns ({size, sha256} of what is there now, whether it is a hard link).

    A hard link where allowed: the workflow never changes a written file in place (it writes a new file and
    renames it), so the version keeps its bytes when the output is rebuilt; the link takes no space and was
    flushed to disk when written. A link shares the source's permissions, so a source without the bits a
    copy would get under the umask (`readable`) is copied instead. A copy is flushed to disk before the
    marker is written. Either way the file is hashed as it is now, which also catches a source changed
    since it was hashed.
    """
    linked = hardlink and os.stat(src).st_mode & readable == readable and _link(src, dst)
    if not linked:
        shutil.copyfile(src, dst)
        _fsync(dst)
    return {"size": os.path.getsize(dst), "sha256": sha256_file(dst)}, linked


def _fsync(path: str | os.PathLike) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: str | os.PathLike) -> None:
    """Make renames and new entries in a folder durable (some file systems refuse: then there is nothing to do)."""
    with contextlib.suppress(OSError):
        _fsync(path)


def _link(src: str, dst: Path) -> bool:
    try:
        os.link(src, dst)
    except OSError as e:
        if e.errno in _NO_LINK:
            return False
        raise
    return True


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _publish_s3(
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
            raise _conflict(store.where(version), version)
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
        problems = verify_s3(store, version, table, by_name, settings)
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
            problems = verify_s3(store, version, table, by_name, settings)
        for name in sorted(n for n in problems if n in by_name):  # a source changed since it was hashed
            if sha256_file(by_name[name]) != table[name]["sha256"]:
                raise PublishError(_changed(name, by_name[name]))
        if problems:
            raise PublishError(
                f"{url} does not hold what was sent: "
                + "; ".join(f"{n}: {p}" for n, p in sorted(problems.items())[:10])
            )
        how = "ETags (reading back mismatches)" if settings.verify == "etag" else f"reading back {total / 1e6:.1f} MB"
        print(f"verified {len(table)} objects by size and {how} in {time.monotonic() - started:.1f} s")
    store.upload_bytes(
        f"{version}/{MARKER}",
        (json.dumps(marker, indent=1, sort_keys=True) + "\n").encode(),
        "--content-type",
        "application/json",
    )
    return marker


def apply_retention(store: Store, keep: int | None, latest: str, markers: dict[str, dict]) -> list[str]:
    """Delete complete versions beyond the newest `keep`, never the one `latest` names; returns the deleted."""
    if not keep:
        return []
    versions = list(by_age(markers))
    doomed = [v for v in versions[: max(0, len(versions) - keep)] if v != latest]
    for version in doomed:
        store.delete_version(version)
        print(f"retention (keep_versions={keep}): deleted {store.where(version)}")
    return doomed


def publish(
    paths: list[str],
    dest: str,
    dataset: str,
    version: str,
    settings: PublishSettings = PublishSettings(),
    s3: S3Settings | None = None,
    now: dt.datetime | None = None,
    known: dict[str, dict] | None = None,
    threads: int = 1,
    names_from: str | os.PathLike | None = None,
) -> dict:
    """Publish files as `{dest}/{dataset}/{version}/` and point `latest` at it; returns the receipt.

    The receipt is the version's marker plus `dest`, `unchanged` (nothing new was published) and `deleted`
    (versions removed by retention). `known`: {name: {size, sha256}} already recorded (see file_table).
    `threads`: files placed and read back at once on a mounted path. `names_from`: a folder; files inside
    it keep their path relative to it (sub-folders included), others their basename (publish_names).
    """
    if settings.verify not in VERIFY_MODES:
        raise ValueError(f"publish.verify must be one of {VERIFY_MODES}, not {settings.verify!r}")
    now = now or dt.datetime.fromtimestamp(time.time(), dt.UTC)
    store = open_store(dest, dataset, s3)
    if isinstance(store, S3Store) and settings.verify == "etag":
        known = None  # ETags are checked against the files as they are now: their sha256 must be too
    named = publish_names(paths, names_from)
    table = file_table(paths, known, names_from)
    previous, markers = store.state()
    if version == AUTO:
        current = markers.get(previous) if previous else None
        if current is not None and same_data(current["files"], table):
            print(f"unchanged: the data equals {store.where(previous)}; nothing published, latest stays {previous}")
            deleted = apply_retention(store, settings.keep_versions, previous, markers)
            return {**current, "dest": dest, "unchanged": True, "deleted": deleted}
        version = auto_version(table, now)
    marker = {
        "dataset": dataset,
        "version": version,
        "files": table,
        "published_at": now.astimezone(dt.UTC).isoformat(timespec="seconds"),
        "previous": previous,
    }
    if isinstance(store, S3Store):
        committed = _publish_s3(named, table, store, version, marker, markers.get(version), settings)
    else:
        committed = _publish_local(
            named, table, store, version, marker, markers.get(version), settings.hardlink, threads
        )
    unchanged = committed is not marker
    if unchanged:
        print(f"{store.where(version)} is already published with this content: nothing to upload")
    if previous != version:
        store.write_latest(version)  # last: only now do readers following latest see the new version
        print(f"latest -> {version} (was {previous})")
    deleted = apply_retention(store, settings.keep_versions, version, {**markers, version: committed})
    return {**committed, "dest": dest, "unchanged": unchanged, "deleted": deleted}


def publish_local(paths: list[str], dest: str, dataset: str, version: str) -> dict:
    """Publish to a mounted path with default settings; returns the version's marker."""
    receipt = publish(paths, dest, dataset, version)
    return {k: receipt[k] for k in ("dataset", "version", "files", "published_at", "previous")}


# --- command line --------------------------------------------------------------------------------


def _s3_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--endpoint-url")
    p.add_argument("--profile")
    p.add_argument("--region")
    p.add_argument("--aws-cli", default="aws")


def _s3_settings(a: argparse.Namespace) -> S3Settings:
    return S3Settings(endpoint_url=a.endpoint_url, profile=a.profile, region=a.region, aws_cli=a.aws_cli)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m shardsmith.publish", description=__doc__.split("\n\n")[0], allow_abbrev=False
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "publish", help="publish files as {dest}/{dataset}/{version}/ and move latest", allow_abbrev=False
    )
    p.add_argument("files", nargs="+")
    p.add_argument("--dest", required=True)
    p.add_argument("--dataset", required=True)
    p.add_argument("--version", required=True, help="a version name, or 'auto'")
    p.add_argument("--keep-versions", type=int)
    p.add_argument("--verify", choices=VERIFY_MODES, default="readback")
    p.add_argument("--multipart-threshold")
    p.add_argument("--multipart-chunksize")
    p.add_argument("--max-concurrent-requests", type=int)
    p.add_argument(
        "--no-hardlink", action="store_true", help="on a mounted path, always copy (default: hard-link where possible)"
    )
    p.add_argument("--threads", type=int, default=1, help="files placed and read back at once on a mounted path")
    p.add_argument(
        "--names-from",
        help="a folder: files inside it are published under their path relative to it (default: basenames)",
    )
    _s3_args(p)
    s = sub.add_parser("show", help="print the complete versions and what latest names", allow_abbrev=False)
    s.add_argument("--dest", required=True)
    s.add_argument("--dataset", required=True)
    _s3_args(s)
    a = parser.parse_args(argv)
    try:
        if a.command == "publish":
            settings = PublishSettings(
                a.keep_versions,
                a.verify,
                a.multipart_threshold,
                a.multipart_chunksize,
                a.max_concurrent_requests,
                not a.no_hardlink,
            )
            receipt = publish(
                a.files,
                a.dest,
                a.dataset,
                a.version,
                settings,
                _s3_settings(a),
                threads=a.threads,
                names_from=a.names_from,
            )
            print(f"published {a.dest.rstrip('/')}/{a.dataset}/{receipt['version']} ({len(receipt['files'])} files)")
        else:
            versions = complete_versions(a.dest, a.dataset, _s3_settings(a))
            latest = latest_version(a.dest, a.dataset, _s3_settings(a))
            for v, m in versions.items():
                print(
                    f"{v}\t{m.get('published_at', '?')}\t{len(m['files'])} files"
                    + ("\t<- latest" if v == latest else "")
                )
    except (PublishConflict, PublishError, S3Error) as e:
        print(f"shardsmith: {redact(str(e))}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
