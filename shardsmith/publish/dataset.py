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
  `complete_versions`, `latest_version` and `read_complete` (shardsmith.storage.stores) rather than listing the prefix.

The file table and fingerprint are shardsmith.publish.contents; the two kinds of destination
shardsmith.publish.mounted and shardsmith.publish.s3.

Publishing the same content under the same version again is a no-op; different content under an existing
version is refused (PublishConflict). `version: auto` names a new version `{UTC date}-{content fingerprint}`
and publishes nothing when the content equals what `latest` names. Optional retention keeps the newest N
complete versions, never the one `latest` names. Credentials come only from the usual AWS environment;
messages pass through `shardsmith.storage.s3.redact`.
"""

import argparse
import datetime as dt
import os
import sys
import time

from shardsmith.publish.contents import (
    AUTO,
    PublishConflict,
    auto_version,
    check_version,
    file_table,
    publish_names,
    same_data,
)
from shardsmith.publish.mounted import publish_mounted
from shardsmith.publish.s3 import publish_s3
from shardsmith.publish.settings import PublishSettings
from shardsmith.storage.s3 import S3Error, S3Settings, redact
from shardsmith.storage.stores import (
    PublishError,
    S3Store,
    Store,
    by_age,
    complete_versions,
    latest_version,
    open_store,
)

VERIFY_MODES = ("readback", "etag")


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


def prepare(
    paths: list[str],
    dest: str,
    dataset: str,
    settings: PublishSettings,
    s3: S3Settings | None,
    known: dict[str, dict] | None,
    names_from: str | os.PathLike | None,
    threads: int = 1,
) -> tuple[Store, dict[str, str], dict[str, dict]]:
    """(the destination, {name: path}, the file table) of a publish, its settings checked."""
    if settings.verify not in VERIFY_MODES:
        raise ValueError(f"publish.verify must be one of {VERIFY_MODES}, not {settings.verify!r}")
    store = open_store(dest, dataset, s3)
    if isinstance(store, S3Store) and settings.verify == "etag":
        known = None  # ETags are checked against the files as they are now: their sha256 must be too
    return store, publish_names(paths, names_from), file_table(paths, known, names_from, threads)


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
    now = now or dt.datetime.fromtimestamp(time.time(), dt.UTC)
    if version != AUTO:
        check_version(version)
    store, named, table = prepare(paths, dest, dataset, settings, s3, known, names_from)
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
        committed = publish_s3(named, table, store, version, marker, markers.get(version), settings)
    else:
        committed = publish_mounted(
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


def add_publish_arguments(p: argparse.ArgumentParser) -> None:
    """`shardsmith publish FILES... --dest ... --dataset ... --version ...`, as the publish_dataset rule does."""
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
    p.set_defaults(run=_publish_command)


def add_versions_arguments(p: argparse.ArgumentParser) -> None:
    """`shardsmith versions --dest ... --dataset ...`: the complete versions, oldest first, and latest."""
    p.add_argument("--dest", required=True)
    p.add_argument("--dataset", required=True)
    _s3_args(p)
    p.set_defaults(run=_versions_command)


def _failed(e: Exception) -> int:
    """The command's error as the workflow's jobs give it: one line, then what to do where it is known."""
    hint = getattr(e, "hint", "")
    print(f"shardsmith: {redact(str(e))}" + (f"\n  fix: {hint}" if hint else ""), file=sys.stderr)
    return 1


def _publish_command(a: argparse.Namespace) -> int:
    missing = [f for f in a.files if not os.path.exists(f)]
    if missing:  # the files are the user's here, not a job's outputs: file_table's advice does not apply
        print(f"shardsmith: publish: {missing[0]} does not exist ({len(missing)} of the files given)", file=sys.stderr)
        return 1
    settings = PublishSettings(
        a.keep_versions,
        a.verify,
        a.multipart_threshold,
        a.multipart_chunksize,
        a.max_concurrent_requests,
        not a.no_hardlink,
    )
    try:
        receipt = publish(
            a.files, a.dest, a.dataset, a.version, settings, _s3_settings(a), threads=a.threads, names_from=a.names_from
        )
    except (PublishConflict, PublishError, S3Error) as e:
        return _failed(e)
    print(f"published {a.dest.rstrip('/')}/{a.dataset}/{receipt['version']} ({len(receipt['files'])} files)")
    return 0


def _versions_command(a: argparse.Namespace) -> int:
    try:
        versions = complete_versions(a.dest, a.dataset, _s3_settings(a))
        latest = latest_version(a.dest, a.dataset, _s3_settings(a))
    except (PublishError, S3Error) as e:
        return _failed(e)
    if not versions:  # said, so that a mistyped --dest or --dataset is not read as "nothing published yet" unseen
        print(f"shardsmith: no complete version of {a.dataset} at {redact(a.dest)}", file=sys.stderr)
    for v, m in versions.items():
        print(f"{v}\t{m.get('published_at', '?')}\t{len(m['files'])} files" + ("\t<- latest" if v == latest else ""))
    return 0
