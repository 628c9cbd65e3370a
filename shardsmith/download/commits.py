"""A running job's progress, committed beside its output so that a stopped job's rerun goes on from it.

A commit folder `{keep}/{name}.progress-{id}/` holds `data` (a hard link to the tar being written, flushed
to disk at each commit) and pieces of rows (parquet, one a commit); `{keep}/{name}.progress.json` names the
folder, its pieces, the data's committed size and what else the writer said (`meta`). The JSON is written
last, so a job killed during a commit leaves the previous one whole; a row is added only once the bytes it
describes are in the tar, so every committed row's bytes lie below the committed size, and bytes past it (a
torn last write) are never read. A job's first commit supersedes an earlier job's folder, which it removes.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import pandas as pd

from shardsmith.core.atomic import atomic_open, atomic_write_text
from shardsmith.formats.tario import ShardWriter


@dataclass
class Committed:
    """What a stopped job committed: its rows, the tar they are in and how much of it is whole."""

    rows: pd.DataFrame
    data: Path
    size: int
    meta: dict


def meta_path(keep: Path, name: str) -> Path:
    return keep / f"{name}.progress.json"


def load(keep: Path, name: str, older: Path | None = None) -> Committed | None:
    """The last commit of `name`, or None: there is none, its files are missing or short, or it is older than
    `older` (a finished job's record, written after the commit and before the commit was removed)."""
    path = meta_path(keep, name)
    try:
        meta = json.loads(path.read_text())
        if older is not None and older.exists() and older.stat().st_mtime_ns > path.stat().st_mtime_ns:
            return None
        folder = keep / meta["dir"]
        if (folder / "data").stat().st_size < meta["size"]:
            return None
        pieces = [pd.read_parquet(folder / p) for p in meta["pieces"]]
    except (OSError, ValueError, KeyError):
        return None
    rows = pd.concat(pieces, ignore_index=True) if pieces else pd.DataFrame()
    return Committed(rows, folder / "data", meta["size"], meta)


def drop(keep: Path, name: str, but: str | None = None) -> None:
    """Remove `name`'s commits: every folder but `but`, and the JSON unless `but` is the folder it names."""
    if but is None:
        meta_path(keep, name).unlink(missing_ok=True)
    for folder in keep.glob(f"{name}.progress-*"):
        if folder.is_dir() and folder.name != but:
            shutil.rmtree(folder, ignore_errors=True)


class Commits:
    """Commits one job's progress (see the module): `add` a row once its bytes are in `writer`; every
    `every_records` rows or `every_s` seconds the rows added so far are committed (`commit` at once), then
    `on_commit` runs. `table` turns a commit's rows into a DataFrame; `meta` goes in the JSON."""

    def __init__(
        self,
        keep: Path,
        name: str,
        file: BinaryIO,
        writer: ShardWriter,
        table: Callable[[list[dict]], pd.DataFrame],
        every_records: int,
        every_s: float,
        meta: dict | None = None,
        log: Callable[[str], None] | None = None,
        on_commit: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.keep, self.name, self.file, self.writer, self.table = Path(keep), name, file, writer, table
        self.every_records, self.every_s, self.meta = every_records, every_s, dict(meta or {})
        self.log, self.on_commit, self.clock = log, on_commit, clock
        self.folder = self.keep / f"{name}.progress-{uuid.uuid4().hex[:12]}"
        self.pending: list[dict] = []
        self.pieces: list[str] = []
        self.committed = 0
        self.last = clock()
        self.enabled = True

    def add(self, row: dict) -> None:
        self.pending.append(row)
        if len(self.pending) >= self.every_records or self.clock() - self.last >= self.every_s:
            self.commit()

    def commit(self) -> None:
        self.last = self.clock()
        if self.enabled and self.pending:
            self._write()
        if self.on_commit is not None:
            self.on_commit()

    def _write(self) -> None:
        self.writer.flush()
        os.fsync(self.file.fileno())
        if not self.pieces:
            self.folder.mkdir(parents=True, exist_ok=True)
            try:
                os.link(self.file.name, self.folder / "data")
            except OSError as e:  # no hard links here: the job runs on without commits
                self.enabled = False
                shutil.rmtree(self.folder, ignore_errors=True)
                if self.log:
                    self.log(f"{self.name}: progress is not kept ({e}); a stopped job starts over")
                return
        piece = f"{len(self.pieces):06d}.parquet"
        with atomic_open(self.folder / piece) as f:
            self.table(self.pending).to_parquet(f, index=False)
        self.pieces.append(piece)
        self.committed += len(self.pending)
        self.pending = []
        meta = {**self.meta, "dir": self.folder.name, "size": self.writer.offset, "pieces": self.pieces,
                "rows": self.committed}  # fmt: skip
        atomic_write_text(meta_path(self.keep, self.name), json.dumps(meta, sort_keys=True) + "\n")
        if len(self.pieces) == 1:
            drop(self.keep, self.name, but=self.folder.name)  # an earlier stopped job's, now superseded
