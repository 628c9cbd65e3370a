"""Publishing spread over jobs: one small job plans the version, jobs of a bounded share of the files each
upload and verify a batch, and one last small job commits it (the marker, then `latest`).

- plan_version: the version's name (`auto`: from the content) and file table, as publish() decides them,
  and the files split into `batches` runs of consecutive names of about equal bytes. A version already
  committed with this content is `unchanged` (nothing to upload); one committed with other content is
  refused (PublishConflict), before anything is sent.
- upload_batch: the batch's files put where the version is assembled, then verified there. Mounted path: a
  staging folder `.{version}.staging` beside the versions (readers skip dot folders), kept across attempts;
  S3: the version's prefix (readers skip a version without its marker). A file a killed attempt already put
  there and that verifies is not sent again.
- commit_version: every batch's receipt checked against the plan, one listing of what was assembled (names
  and sizes: all there, and nothing else, which it removes), the marker, the rename into place (mounted),
  `latest`, retention.

The marker is the one publish() writes for the same files, so a version published by several upload jobs
is byte-identical to one published by one. A kill at any point leaves `latest` on the previous version.
"""

import datetime as dt
import json
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from shardsmith.core.atomic import UMASK, atomic_write_text, sha256_file
from shardsmith.publish.contents import AUTO, auto_version, check_version, conflict, mismatch, same_data
from shardsmith.publish.dataset import apply_retention, prepare
from shardsmith.publish.mounted import fsync_dir, fsync_file, place
from shardsmith.publish.s3 import cli_config, mend, verify_s3
from shardsmith.publish.settings import PublishSettings
from shardsmith.storage.s3 import S3Settings, run
from shardsmith.storage.stores import MARKER, LocalStore, PublishError, S3Store, open_store

PER_FILE_BYTES = 1 << 20  # a file's fixed cost (a request, a link, a hash started) in bytes, for balancing
_NO_TIMEOUT = None


def staging_dir(store: LocalStore, version: str) -> Path:
    return Path(store.root, f".{version}.staging")


def recorded_hashes(infos: list[dict]) -> dict[str, dict]:
    """{name: {size, sha256}} that write_shard recorded in its info files: each shard's, and its loaders'
    indexes' ("files"), so that plan_version does not read them again."""
    known: dict[str, dict] = {}
    for info in infos:
        known[info["shard"]] = {"size": info["filesize"], "sha256": info["sha256"]}
        known |= info.get("files", {})
    return known


def split_batches(table: dict[str, dict], count: int) -> list[list[str]]:
    """The names in order, cut into `count` runs of about equal bytes (plus PER_FILE_BYTES a file)."""
    names = sorted(table)
    weights = [table[n]["size"] + PER_FILE_BYTES for n in names]
    total = sum(weights) or 1
    batches: list[list[str]] = [[] for _ in range(max(1, count))]
    done = 0
    for name, weight in zip(names, weights, strict=True):
        batches[min(len(batches) - 1, (2 * done + weight) * len(batches) // (2 * total))].append(name)
        done += weight
    return batches


def plan_version(
    paths: list[str],
    dest: str,
    dataset: str,
    version: str,
    batches: int,
    settings: PublishSettings = PublishSettings(),
    s3: S3Settings | None = None,
    known: dict[str, dict] | None = None,
    names_from: str | os.PathLike | None = None,
    now: dt.datetime | None = None,
    threads: int = 1,
) -> tuple[dict, list[dict[str, dict]]]:
    """(the version: dest, dataset, version, previous, unchanged, table; each batch's {name: {path, size,
    sha256}}). `known`, `names_from`: as publish() takes them; `threads`: files hashed at once."""
    now = now or dt.datetime.fromtimestamp(time.time(), dt.UTC)
    if version != AUTO:
        check_version(version)
    store, named, table = prepare(paths, dest, dataset, settings, s3, known, names_from, threads)
    previous, markers = store.state()
    unchanged = False
    if version == AUTO:
        current = markers.get(previous) if previous else None
        unchanged = current is not None and same_data(current["files"], table)
        version = previous if unchanged else auto_version(table, now)
    if not unchanged and version in markers:
        if markers[version]["files"] != table:
            raise conflict(store.where(version), version)
        unchanged = True
    plan = {"dest": dest, "dataset": dataset, "version": version, "previous": previous, "unchanged": unchanged}
    names = [] if unchanged else split_batches(table, batches)
    runs = [{n: {"path": os.path.abspath(named[n]), **table[n]} for n in batch} for batch in names]
    runs += [{} for _ in range(batches - len(runs))]
    return {**plan, "table": table}, runs


def upload_batch(
    plan: dict,
    batch: dict[str, dict],
    after: str | None,
    settings: PublishSettings = PublishSettings(),
    s3: S3Settings | None = None,
    threads: int = 1,
) -> dict:
    """Put the batch's files where the version is assembled and verify them there; returns the receipt
    ({version, files: {name: {size, sha256}}}). `after`: the last name of the batches before (S3 lists the
    keys after it), None for the first."""
    receipt = {
        "version": plan["version"],
        "files": {n: {"size": e["size"], "sha256": e["sha256"]} for n, e in batch.items()},
    }
    if plan["unchanged"] or not batch:
        return receipt
    store = open_store(plan["dest"], plan["dataset"], s3)
    if isinstance(store, S3Store):
        _upload_s3(store, plan["version"], batch, after, settings)
    else:
        _upload_mounted(store, plan["version"], batch, settings.hardlink, threads)
    return receipt


def _upload_mounted(store: LocalStore, version: str, batch: dict[str, dict], hardlink: bool, threads: int) -> None:
    final = Path(store.where(version))
    if final.exists():  # committed since the plan was made
        marker = store.marker(version) or {}
        if any(marker.get("files", {}).get(n) != {"size": e["size"], "sha256": e["sha256"]} for n, e in batch.items()):
            raise conflict(str(final), version)
        return
    staging = staging_dir(store, version)
    readable = 0o666 & ~UMASK
    for folder in sorted({(staging / n).parent for n in batch}):
        folder.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max(1, threads)) as pool:
        placed = {n: pool.submit(_stage, e["path"], staging / n, e, hardlink, readable) for n, e in batch.items()}
        try:
            how = {"kept": 0, "linked": 0, "copied": 0}
            for name, entry in batch.items():
                got, what = placed[name].result()
                want = {"size": entry["size"], "sha256": entry["sha256"]}
                if got != want:
                    found = f"the file on {store.dest} has {got['size']} bytes with sha256 {got['sha256'][:12]}"
                    raise PublishError(mismatch(name, entry["path"], want, found))
                how[what] += 1
        except BaseException:
            pool.shutdown(cancel_futures=True)
            raise
    for folder in sorted({(staging / n).parent for n in batch}, reverse=True):
        fsync_dir(folder)
    print(
        f"{len(batch)} files in {staging} and read back: {how['kept']} already there from an earlier attempt, "
        f"{how['linked']} hard-linked, {how['copied']} copied"
    )


def _stage(src: str, dst: Path, want: dict, hardlink: bool, readable: int) -> tuple[dict, str]:
    """Put src at dst unless an earlier attempt did (same size and sha256: kept, flushed); returns
    ({size, sha256} of what is there now, kept / linked / copied)."""
    there = dst.is_file() and not dst.is_symlink() and dst.stat().st_size == want["size"]
    if there and sha256_file(dst) == want["sha256"]:
        fsync_file(dst)  # a copy a killed attempt made may not be on disk yet
        return {"size": want["size"], "sha256": want["sha256"]}, "kept"
    if dst.exists() or dst.is_symlink():
        dst.unlink()
    got, linked = place(src, dst, hardlink, readable)
    return got, "linked" if linked else "copied"


def _upload_s3(
    store: S3Store, version: str, batch: dict[str, dict], after: str | None, settings: PublishSettings
) -> None:
    url = store.where(version) + "/"
    last = max(batch)
    by_name = {n: e["path"] for n, e in batch.items()}
    table = {n: {"size": e["size"], "sha256": e["sha256"]} for n, e in batch.items()}
    objects = store.listing_range(url, after, last)
    todo = [n for n in sorted(batch) if objects.get(n, {}).get("size") != batch[n]["size"]]
    started = time.monotonic()
    with cli_config(settings, store.s3), tempfile.TemporaryDirectory(prefix="shardsmith-publish-") as stage:
        if todo:
            for name in todo:
                Path(stage, name).parent.mkdir(parents=True, exist_ok=True)
                os.symlink(by_name[name], Path(stage, name))  # cp follows links: one CLI run, parallel uploads
            run(store.s3, "s3", "cp", "--recursive", "--only-show-errors", stage + "/", url, timeout=_NO_TIMEOUT)
        sent = sum(batch[n]["size"] for n in todo)
        print(
            f"sent {len(todo)} of the batch's {len(batch)} files ({sent / 1e6:.1f} MB; "
            f"{len(batch) - len(todo)} already there from an earlier attempt) in {time.monotonic() - started:.1f} s"
        )
        started = time.monotonic()
        check = lambda: verify_s3(store, version, table, by_name, settings, store.listing_range(url, after, last))  # noqa: E731
        mend(store, version, table, by_name, settings, check(), check)
    print(f"verified {len(batch)} objects ({settings.verify}) in {time.monotonic() - started:.1f} s")


def commit_version(
    plan: dict,
    receipts: list[dict],
    settings: PublishSettings = PublishSettings(),
    s3: S3Settings | None = None,
    now: dt.datetime | None = None,
) -> dict:
    """Commit the version once every batch is uploaded: its receipt (the marker plus dest, unchanged and
    deleted), as publish() returns it."""
    now = now or dt.datetime.fromtimestamp(time.time(), dt.UTC)
    store = open_store(plan["dest"], plan["dataset"], s3)
    version, previous, table = plan["version"], plan["previous"], plan["table"]
    latest, markers = store.state()
    unchanged = True
    if plan["unchanged"]:
        committed = markers.get(version)
        if committed is None:
            raise PublishError(f"{store.where(version)} is no longer a complete version; publish again")
        print(f"{store.where(version)} is already published with this content: nothing uploaded")
    else:
        uploaded: dict[str, dict] = {}
        for r in receipts:
            if r["version"] != version:
                raise PublishError(f"an upload receipt is for version {r['version']}, not {version}: upload again")
            uploaded |= r["files"]
        if uploaded != table:
            missing = sorted(set(table) - set(uploaded))[:5]
            raise PublishError(f"the upload receipts do not cover the version's files (e.g. {missing}): upload again")
        marker = {
            "dataset": plan["dataset"],
            "version": version,
            "files": table,
            "published_at": now.astimezone(dt.UTC).isoformat(timespec="seconds"),
            "previous": previous,
        }
        if version in markers:
            if markers[version]["files"] != table:
                raise conflict(store.where(version), version)
            committed = markers[version]
        else:
            commit = _commit_s3 if isinstance(store, S3Store) else _commit_mounted
            committed, unchanged = commit(store, version, marker), False
    if latest != version:
        store.write_latest(version)  # last: only now do readers following latest see the new version
        print(f"latest -> {version} (was {latest})")
    deleted = apply_retention(store, settings.keep_versions, version, {**markers, version: committed})
    return {**committed, "dest": plan["dest"], "unchanged": unchanged, "deleted": deleted}


def _commit_mounted(store: LocalStore, version: str, marker: dict) -> dict:
    staging, table = staging_dir(store, version), marker["files"]
    found = {p.relative_to(staging).as_posix(): p for p in staging.rglob("*") if p.is_file() or p.is_symlink()}
    wrong = [n for n, e in table.items() if n not in found or found[n].stat().st_size != e["size"]]
    if wrong:
        raise PublishError(
            f"{staging} lacks {len(wrong)} of the version's files as uploaded (e.g. {wrong[0]}): upload again"
        )
    for name in sorted(set(found) - set(table)):  # left by an attempt with other content
        found[name].unlink()
    for folder in sorted({p for p in staging.rglob("*") if p.is_dir()}, reverse=True):
        if not any(folder.iterdir()):
            folder.rmdir()
        else:
            fsync_dir(folder)
    fsync_dir(staging)  # the files' entries before the marker's
    atomic_write_text(staging / MARKER, json.dumps(marker, indent=1, sort_keys=True) + "\n")
    os.chmod(staging, 0o777 & ~UMASK)
    os.rename(staging, store.where(version))
    fsync_dir(store.root)
    print(f"{len(table)} files committed as {store.where(version)}")
    return marker


def _commit_s3(store: S3Store, version: str, marker: dict) -> dict:
    url, table = store.where(version) + "/", marker["files"]
    objects, _ = store.listing(url)
    wrong = [n for n, e in table.items() if objects.get(n, {}).get("size") != e["size"]]
    if wrong:
        raise PublishError(
            f"{url} lacks {len(wrong)} of the version's files as uploaded (e.g. {wrong[0]}): upload again"
        )
    strays = sorted(n for n in objects if n not in table and n != MARKER)  # left by an attempt with other content
    for i in range(0, len(strays), 500):
        filters = [arg for name in strays[i : i + 500] for arg in ("--include", name)]
        run(
            store.s3,
            "s3",
            "rm",
            "--recursive",
            "--only-show-errors",
            url,
            "--exclude",
            "*",
            *filters,
            timeout=_NO_TIMEOUT,
        )
    store.upload_bytes(
        f"{version}/{MARKER}",
        (json.dumps(marker, indent=1, sort_keys=True) + "\n").encode(),
        "--content-type",
        "application/json",
    )
    print(f"{len(table)} objects committed as {url} ({len(strays)} left by an earlier attempt removed)")
    return marker
