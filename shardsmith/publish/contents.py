"""What a published version holds: the names and the {size, sha256} table of its files, the content
fingerprint that tells two versions' data apart, `version: auto` names, and the conflict raised when a
version would change."""

import datetime as dt
import hashlib
import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from shardsmith.core.atomic import sha256_file
from shardsmith.formats.build import BUILD_INFO
from shardsmith.storage.stores import LATEST, MARKER, PublishError

AUTO = "auto"
# A version is a folder or key prefix beside `latest`: one name of plain characters (the config schema's
# pattern), and never `latest` itself, whose version folder would stand where the pointer is written.
VERSION_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
CARD = "README.md"  # the dataset card (shardsmith.report.card): its title names the version
DESCRIBES_THE_BUILD = (BUILD_INFO, CARD)  # not data: left out of the content fingerprint


class PublishConflict(RuntimeError):
    """Different content under a version that is already published."""


def conflict(where: str, version: str) -> PublishConflict:
    return PublishConflict(
        f"{where} is already published with different content; choose a new version (config: version, "
        f"or version: auto) instead of overwriting what readers may be training from. "
        f"The files of {version} are listed in {where}/{MARKER}."
    )


def files_of(paths: list[str]) -> list[str]:
    """The paths, a folder given as the files below it (the manifest and the ledger are folders of pieces),
    but for hidden ones (Snakemake's `.snakemake_timestamp` in a directory output; readers skip them too)."""
    files = []
    for p in paths:
        if os.path.isdir(p):
            below = (f for f in Path(p).rglob("*") if f.is_file())
            files += sorted(str(f) for f in below if not any(s.startswith(".") for s in f.relative_to(p).parts))
        else:
            files.append(p)
    return files


def publish_names(paths: list[str], names_from: str | os.PathLike | None = None) -> dict[str, str]:
    """{name in the version: path} of the files to publish (a folder's: each file below it), sorted by name.

    A file's name is its basename, or with `names_from` its path relative to that folder when it lies
    inside it: `.nv-meta/index.sqlite` is published as that sub-folder and file of the version (on S3, that
    key below the version prefix). Names are relative, with `/` between parts and no `.` or `..` part.
    """
    base = Path(os.path.abspath(names_from)) if names_from is not None else None
    named: dict[str, str] = {}
    for p in files_of(paths):
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
    paths: list[str],
    known: dict[str, dict] | None = None,
    names_from: str | os.PathLike | None = None,
    threads: int = 1,
) -> dict[str, dict]:
    """{name: {size, sha256}} of the files to publish, sorted by name (publish_names names them).

    `known` gives {size, sha256} recorded when a file was written (write_shard hashes every shard): such a
    file is not read and hashed a second time. Only a publish that reads back what lands on the destination
    and checks it against these hashes may pass them (see publish); a file whose size is no longer the
    recorded one is refused here. The others are hashed `threads` at a time (hashing releases the GIL).
    """
    known = known or {}
    named = publish_names(paths, names_from)
    missing = [p for p in named.values() if not os.path.exists(p)]
    if missing:
        raise PublishError(
            f"{missing[0]} is missing ({len(missing)} files in all), though the job that writes it ran: deleted "
            "since? Run again with --forcerun write_shard (each batch keeps its shards that are whole) or the "
            "rule that writes it"
        )
    sizes = {name: os.path.getsize(p) for name, p in named.items()}
    for name, p in named.items():
        if name in known and known[name]["size"] != sizes[name]:
            raise PublishError(changed(name, p))
    with ThreadPoolExecutor(max(1, threads)) as pool:
        hashed = dict(
            zip((todo := [n for n in named if n not in known]), pool.map(sha256_file, (named[n] for n in todo)))
        )
    return {
        name: {"size": sizes[name], "sha256": known[name]["sha256"] if name in known else hashed[name]}
        for name in named
    }


def changed(name: str, source: str | os.PathLike) -> str:
    return (
        f"{name}: changed since it was written and hashed ({source}); remove it, or run snakemake with "
        "--forcerun for the rule that writes it, to write it again"
    )


def mismatch(name: str, source: str | os.PathLike, want: dict, got: str) -> str:
    """Why a file on the destination differs: the source changed since it was hashed, or the copy is bad."""
    if sha256_file(source) != want["sha256"]:
        return changed(name, source)
    return f"{name}: {got}, which does not match the source ({want['size']} bytes, sha256 {want['sha256'][:12]})"


def content_fingerprint(table: dict[str, dict]) -> str:
    """sha256 of the published data (names and sha256s), without build.json and the card: same data, same
    fingerprint, whatever the version is called and wherever it was built."""
    data = {name: entry["sha256"] for name, entry in sorted(table.items()) if name not in DESCRIBES_THE_BUILD}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def same_data(a: dict[str, dict], b: dict[str, dict]) -> bool:
    return content_fingerprint(a) == content_fingerprint(b)


def check_version(version: str) -> None:
    """Refuse a version name that is no single plain name, or that is `latest`, before anything is written."""
    if version == LATEST or not VERSION_NAME.fullmatch(version):
        raise PublishError(
            f"version {version!r} cannot be published: a version is a name of letters, digits, '.', '_' and '-' "
            f"(at most 64, starting with a letter or digit), not {LATEST!r}, or 'auto'"
        )


def auto_version(table: dict[str, dict], now: dt.datetime) -> str:
    """`{UTC date}-{first 8 hex of the content fingerprint}`: sorts by date, differs when the data differs."""
    return f"{now.astimezone(dt.UTC):%Y-%m-%d}-{content_fingerprint(table)[:8]}"
