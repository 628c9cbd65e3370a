"""The raw cache, one owner for its files: `{raw}/{dataset}/{part}.tar` holds each fetched record's bytes
exactly as fetched (member `r{rid:07d}.img`) and its source fields (`r{rid:07d}.meta`, JSON with sorted
keys), in arrival order; `{part}.status.parquet` has one STATUS_COLUMNS row per record, ok or the reason.

Both are hard-linked under `.keep/` with a JSON that says they belong together (Keep): Snakemake deletes a
job's outputs before it reruns the job, the links survive, and a rerun reuses every record whose URL is
unchanged and whose outcome is final. `mark_failed` asks, through a `.retry` marker, for failures with
given reasons to be fetched again.

While a part runs, its progress is committed there too (`progress`, shardsmith.download.commits): every
COMMIT_RECORDS records or COMMIT_SECONDS, the raw tar so far and the status rows of the records it holds. A
run killed at any moment leaves its last commit, whose records the rerun reuses as it does a finished run's.
"""

import contextlib
import json
import os
import shutil
import tarfile
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

import pandas as pd

from shardsmith.core.atomic import atomic_write_text, sha256_file
from shardsmith.download import commits
from shardsmith.download.fetch.responses import Outcome
from shardsmith.formats.tario import ShardWriter, read_at

STATUS_COLUMNS = [
    "rid", "source", "source_id", "url", "key", "status", "reason", "detail", "bytes", "http_status", "attempts",
]  # fmt: skip
STATUS_TYPES = {"rid": "int64", "bytes": "int64", "http_status": "int64", "attempts": "int64"}
KEEP_DIR = ".keep"
# A commit of a running part every this many records or seconds, whichever comes first: at LAION's 250,000
# records a part, a kill loses at most 0.4% of it (and what is in flight).
COMMIT_RECORDS = 1000
COMMIT_SECONDS = 60.0


def encode_fields(fields: dict) -> bytes:
    """A record's source fields as its `.meta` member holds them (keys sorted: the same bytes every run)."""
    return json.dumps(fields, sort_keys=True, ensure_ascii=False).encode("utf-8")


def write_raw(tar: ShardWriter, rid: int, data: bytes, meta: bytes) -> dict[str, tuple[int, int]]:
    """Append one record's image and `.meta`; returns {ext: (offset, size)} of the members written."""
    return tar.write(f"r{rid:07d}", {"img": data, "meta": meta})


def raw_members(raw_tar: str | os.PathLike, limit: int | None = None) -> dict[int, dict[str, tuple[int, int]]]:
    """{rid: {ext: (offset, size)}} of a raw part tar (members r{rid:07d}.img and .meta), from its headers only;
    with `limit`, only the members below that offset (a running part's committed size: what follows may be
    torn, and has no end-of-archive blocks)."""
    where: dict[int, dict[str, tuple[int, int]]] = {}
    with tarfile.open(raw_tar, mode="r:") as tar:
        while limit is None or tar.offset < limit:
            info = tar.next()
            if info is None:
                break
            key, ext = info.name.split(".", 1)
            where.setdefault(int(key[1:]), {})[ext] = (info.offset_data, info.size)
    return where


def iter_raw(raw_tar: str | os.PathLike) -> Iterator[tuple[int, tuple[int, int], dict]]:
    """(rid, (offset, size) of the image, source fields) for every fetched record of a raw part tar, in
    record order; the headers and the small meta members are read, the images are not."""
    where = raw_members(raw_tar)
    with open(raw_tar, "rb") as f:
        for rid in sorted(where):
            members = where[rid]
            if "img" in members and "meta" in members:
                yield rid, members["img"], json.loads(read_at(f, *members["meta"]))


FILTERED = "filtered"  # a status row's status for a record a filter left out: never requested


def filtered_row(rec: dict) -> dict:
    """The status row of a record a filter left out when parts were planned: its reason is the filter's name,
    its detail what the filter saw (shardsmith.download.filters)."""
    return {
        **{c: rec[c] for c in ("rid", "source", "source_id", "url", "key")},
        "status": FILTERED,
        "reason": rec["filter"],
        "detail": rec.get("filter_detail") or "",
        "bytes": 0,
        "http_status": 0,
        "attempts": 0,
    }


def status_row(rec: dict, outcome: Outcome) -> dict:
    return {
        **{c: rec[c] for c in ("rid", "source", "source_id", "url", "key")},
        "status": "ok" if outcome.ok else "error",
        "reason": outcome.reason,
        "detail": outcome.detail,
        "bytes": outcome.nbytes,
        "http_status": outcome.http_status,
        "attempts": outcome.attempts,
    }


def ok_row(rec: dict, data: bytes, fields: dict, http_status: int = 0, attempts: int = 1) -> tuple[dict, bytes, dict]:
    return status_row(rec, Outcome(nbytes=len(data), http_status=http_status, attempts=attempts)), data, fields


def error_row(rec: dict, reason: str, detail: str, http_status: int = 0, attempts: int = 1) -> tuple[dict, None, None]:
    outcome = Outcome(reason=reason, detail=detail, http_status=http_status, attempts=attempts)
    return status_row(rec, outcome), None, None


class Keep:
    """The .keep links of one part's raw tar and status, with a small JSON that says they belong together."""

    def __init__(self, out_tar: str | os.PathLike) -> None:
        out_tar = Path(out_tar)
        part = out_tar.name.removesuffix(".tar")
        self.dir = out_tar.parent / KEEP_DIR
        self.tar = self.dir / f"{part}.tar"
        self.status = self.dir / f"{part}.status.parquet"
        self.meta = self.dir / f"{part}.json"
        self.marker = self.dir / f"{part}.retry"
        self.part = part
        self.source, self.limit = self.tar, None  # where kept records are read from: load() decides
        self.committed: dict | None = None  # what a stopped run's last commit says, when load() took it
        self._reader = None

    def load(self) -> pd.DataFrame | None:
        """The kept status table, or None when there is none or its files do not match (a run killed mid-save):
        a stopped run's last commit where it is newer than the last finished run's files."""
        committed = self._load_progress()
        if committed is not None:
            return committed
        try:
            meta = json.loads(self.meta.read_text())
            if self.tar.stat().st_size != meta["tar_size"] or sha256_file(self.status) != meta["status_sha256"]:
                return None
            status = pd.read_parquet(self.status)
        except (OSError, ValueError, KeyError):
            return None
        for col in STATUS_COLUMNS:  # a keep written before a column existed
            if col not in status:
                status[col] = 0
        return status

    def mark(self, reasons: set[str]) -> None:
        """Ask for these failures to be fetched again (see mark_failed)."""
        atomic_write_text(self.marker, json.dumps({"reasons": sorted(reasons)}) + "\n")

    def marked_reasons(self, marker: str | os.PathLike | None) -> set[str]:
        """The reasons a retry marker asks for, if it was set after this part's last download."""
        try:
            if marker is None or (self.meta.exists() and os.path.getmtime(marker) < os.path.getmtime(self.meta)):
                return set()
            return set(json.loads(Path(marker).read_text())["reasons"])
        except (OSError, ValueError, KeyError, TypeError):
            return set()

    def _load_progress(self) -> pd.DataFrame | None:
        got = commits.load(self.dir, self.part, older=self.meta)
        if got is None or "rid" not in got.rows:
            return None
        self.source, self.limit, self.committed = got.data, got.size, got.meta
        return got.rows.drop_duplicates("rid", keep="last").reset_index(drop=True)

    def members(self) -> dict[int, dict[str, tuple[int, int]]]:
        """{rid: {ext: (offset, size)}} of the kept tar (up to the committed size), from its headers only."""
        return raw_members(self.source, self.limit)

    def read(self, where: tuple[int, int]) -> bytes:
        if self._reader is None:
            self._reader = open(self.source, "rb")  # noqa: SIM115 - one handle for the whole part; see close()
        self._reader.seek(where[0])
        data = self._reader.read(where[1])
        if len(data) != where[1]:
            raise OSError(f"{self.source}: short read at {where[0]}")
        return data

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def save(self, out_tar: str, out_status: str, status: pd.DataFrame) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        link_or_copy(Path(out_tar), self.tar)
        link_or_copy(Path(out_status), self.status)
        meta = {
            "tar_size": self.tar.stat().st_size,
            "status_sha256": sha256_file(self.status),
            "records": len(status),
            "reasons": dict(Counter(r for r in status["reason"] if r)),
        }
        atomic_write_text(self.meta, json.dumps(meta, indent=1, sort_keys=True) + "\n")
        commits.drop(self.dir, self.part)


def progress(
    keep: Keep,
    file: BinaryIO,
    writer: ShardWriter,
    log: Callable[[str], None] | None = None,
    on_commit: Callable[[], None] | None = None,
) -> commits.Commits:
    """Commits of a part being downloaded into `writer` (the temporary raw tar `file`): add each record's
    status row once its bytes are written; `on_commit` runs after each commit."""

    def table(rows: list[dict]) -> pd.DataFrame:
        return pd.DataFrame(rows, columns=STATUS_COLUMNS).astype(STATUS_TYPES)

    return commits.Commits(
        keep.dir, keep.part, file, writer, table, COMMIT_RECORDS, COMMIT_SECONDS, log=log, on_commit=on_commit
    )


def link_or_copy(src: Path, dst: Path) -> None:
    """Make `dst` the same file as `src` (a hard link; a copy where links are not supported), atomically."""
    tmp = dst.parent / f".{dst.name}.{os.getpid()}.tmp"
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    try:
        os.link(src, tmp)
    except OSError:
        shutil.copyfile(src, tmp)
    os.replace(tmp, dst)
    # renaming a link onto another link of the same file does nothing (POSIX): the temporary name stays
    tmp.unlink(missing_ok=True)


def reusable(prev: dict | None, rec: dict, retry: set[str]) -> bool:
    """A kept outcome stands when it is for the same URL and source record and is not to be retried; a record
    a filter left out before is fetched now that none does."""
    return (
        prev is not None
        and prev["url"] == rec["url"]
        and prev["source_id"] == rec["source_id"]
        and (prev["status"] == "ok" or (prev["status"] != FILTERED and prev["reason"] not in retry))
    )


def mark_failed(raw_dir: str | os.PathLike, reasons: set[str], dry_run: bool = False) -> dict[str, Counter]:
    """Write `.keep/{part}.retry` (the reasons) for every downloaded part with failures for these reasons;
    returns {part: reasons found}.

    download_part takes the marker as an input when it exists (rules/common.smk, get_retry_marker), so the
    next snakemake run, whatever its command line, downloads exactly these parts again (fetching only their
    failed records with these reasons; the rest comes from the keep) and updates what depends on them.
    """
    raw_dir = Path(raw_dir)
    marked: dict[str, Counter] = {}
    for meta in sorted((raw_dir / KEEP_DIR).glob("*.json")):
        part = meta.name.removesuffix(".json")
        kept = Keep(raw_dir / f"{part}.tar").load()
        failed = kept[kept["status"] == "error"] if kept is not None else None
        hits = Counter(r for r in failed["reason"] if r in reasons) if failed is not None else Counter()
        if hits:
            marked[part] = hits
            if not dry_run:
                Keep(raw_dir / f"{part}.tar").mark(reasons)
    return marked
