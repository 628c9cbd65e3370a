"""Repeated keys and exclusions decided per key bucket; the shards assigned from per-part counts.

Parts are taken in groups of consecutive parts (one job each, not one a part: the jobs are light and a
LAION-size DAG is long). Every sample's key (with its id, shardsmith.shards.sampleid: dataset order) is written
by its group's job to the bucket its key hashes to (`split_keys`), and every row of the exclusion tables
likewise (`split_exclusions`, numbered below zero in table order, so the first exclusion of a key counts).
A bucket job (`find_duplicate_keys`) sees every row of its keys and decides alone: an excluded key's samples drop
with the exclusion's reason, and of a key's other samples all but the first drop as duplicate_key. Its
decisions go to one batch per group, so each group's job (`collect_dropped`) gathers its own from every bucket:
its ledger rows and, per part, how many samples stay. The plan (`shard_ranges`) holds the parts' counts
and, a piece at a time, the rows left out: shard i holds the kept samples i x samples_per_shard onwards,
in part and record order, as a few (part, first row, end row, rows left out between) ranges, and the
shard's job reads its samples itself (`shard_rows`). Which bucket a key lands in decides nothing, so any
bucket count gives the same shards and ledger.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shardsmith.core.atomic import atomic_open, atomic_write_text
from shardsmith.core.ledger import REJECT_COLUMNS, SHARD
from shardsmith.formats.names import shard_name
from shardsmith.formats.shuffle import cut, read_bucket, write_buckets
from shardsmith.formats.tables import Spill, key_bins, key_digest_sum, num_rows, spill_folder
from shardsmith.shards.sampleid import part_of, part_range, row_of, sample_ids, split

STAGE = SHARD
KEYS = pa.schema([("key", pa.large_string()), ("id", pa.int64()), ("source_id", pa.large_string())])
EXCLUDED = pa.schema(
    [("key", pa.large_string()), ("id", pa.int64()), ("stage", pa.large_string()), ("reason", pa.large_string()),
     ("detail", pa.large_string())]
)  # fmt: skip
DROPS = pa.schema(
    [("id", pa.int64()), ("stage", pa.large_string()), ("reason", pa.large_string()), ("detail", pa.large_string())]
)
LEDGER_PIECE = REJECT_COLUMNS + ["id"]  # the ledger's columns, and which sample (the shards' jobs skip them)


def group_of(ids: np.ndarray, parts_per_group: int) -> np.ndarray:
    return part_of(ids) // parts_per_group


def split_keys(samples: list[str], first_part: int, buckets: int, out: str | os.PathLike) -> int:
    """The keys, ids and source ids of a group's parts (the first being part `first_part`), one batch per
    bucket; returns the samples."""
    tables = []
    for i, path in enumerate(samples):
        t = pq.read_table(path, columns=["key", "source_id"])
        ids = pa.array(sample_ids(first_part + i, np.arange(t.num_rows)))
        tables.append(pa.table({"key": t["key"], "id": ids, "source_id": t["source_id"]}).cast(KEYS))
    table = pa.concat_tables(tables) if tables else KEYS.empty_table()
    write_buckets(out, KEYS, cut(table, key_bins(table["key"], buckets), buckets))
    return table.num_rows


SPILL_FILES = 512  # files a job keeps open while spilling: each holds a contiguous range of buckets


def split_exclusions(tables: list[str], buckets: int, out: str | os.PathLike, tmp: str | None = None) -> int:
    """Every row of the exclusion tables, numbered below zero in order, one batch per bucket (spilled to disk
    on the way, in at most SPILL_FILES files of consecutive buckets, so the job holds one file's rows at a
    time and keeps that many open at any bucket count); returns the rows."""
    total = sum(num_rows(p) for p in tables)
    files = min(buckets, SPILL_FILES)
    with spill_folder(tmp) as spill_dir:
        spill = Spill(spill_dir if files > 1 else None, files, EXCLUDED)
        at = -total
        for path in tables:
            for batch in pq.ParquetFile(path).iter_batches(
                columns=["key", "stage", "reason", "detail"], batch_size=65536
            ):
                t = pa.Table.from_batches([batch])
                ids = pa.array(np.arange(at, at + t.num_rows, dtype=np.int64))
                at += t.num_rows
                rows = pa.table({"key": t["key"], "id": ids, "stage": t["stage"], "reason": t["reason"],
                                 "detail": t["detail"]}).cast(EXCLUDED)  # fmt: skip
                spill.add(rows, key_bins(rows["key"], buckets) * files // buckets)
        spill.close()

        def pieces() -> Iterator[pa.Table]:
            for f in range(files):  # file f holds buckets ceil(f x buckets / files) up to the next file's first
                lo, hi = -(-f * buckets // files), -(-(f + 1) * buckets // files)
                rows = spill.read(f)
                yield from cut(rows, key_bins(rows["key"], buckets) - lo, hi - lo)

        write_buckets(out, EXCLUDED, pieces(), {"rows": total})
    return total


def decide_bucket(keys: pa.Table, excluded: pa.Table) -> pd.DataFrame:
    """(id, stage, reason, detail) of the samples of one bucket that drop, by id: an excluded key's samples with
    the exclusion's reason (its first row counts), of the other samples of a key all but the first."""
    cols = DROPS.names
    none = pd.DataFrame({c: pd.Series(dtype="int64" if c == "id" else object) for c in cols})
    if keys.num_rows == 0 or (excluded.num_rows == 0 and pc.count_distinct(keys["key"]).as_py() == keys.num_rows):
        return none  # no exclusion and no repeated key: nothing drops, and no key becomes a Python string
    samples = keys.to_pandas().sort_values("id", kind="stable")
    reasons = (
        excluded.to_pandas().sort_values("id", kind="stable").drop_duplicates("key").set_index("key")
        [["stage", "reason", "detail"]]
    )  # fmt: skip
    hit = samples["key"].isin(reasons.index)
    rest = samples[~hit]
    dup = rest.duplicated("key", keep="first")
    pieces = [samples[hit][["id", "key"]].join(reasons, on="key")]
    if dup.any():
        first = rest[~dup].set_index("key")["source_id"]
        repeat = rest[dup][["id", "key"]].assign(stage=STAGE, reason="duplicate_key")
        repeat["detail"] = ["same key as " + sid for sid in first.loc[repeat["key"]]]
        pieces.append(repeat)
    return pd.concat(pieces, ignore_index=True)[cols].sort_values("id", kind="stable").reset_index(drop=True)


def find_duplicate_keys(key_paths: list[str], excluded_path: str, bucket: int, parts_per_group: int, out) -> int:
    """A bucket's decisions, one batch per group (the groups of `key_paths`, in order), so each group reads
    only its own; returns the samples that drop."""
    keys = read_bucket(key_paths, bucket, KEYS)
    drops = decide_bucket(keys, read_bucket(excluded_path, bucket, EXCLUDED))
    table = pa.Table.from_pandas(drops, preserve_index=False).cast(DROPS) if len(drops) else DROPS.empty_table()
    meta = kept_keys(keys, drops["id"].to_numpy(np.int64), bucket)
    write_buckets(out, DROPS, cut(table, group_of(drops["id"].to_numpy(), parts_per_group), len(key_paths)), meta)
    return len(drops)


def kept_keys(keys: pa.Table, dropped: np.ndarray, bucket: int) -> dict:
    """The bucket's keys that stay (count and digest sum: formats.tables.key_digest_sum), for validate_dataset
    to check the shards against; they must be distinct, which this bucket alone can tell (a key's rows are all
    in its bucket)."""
    kept = (
        keys["key"].filter(pc.invert(pc.is_in(keys["id"], pa.array(dropped, pa.int64()))))
        if len(dropped)
        else keys["key"]
    )
    if pc.count_distinct(kept).as_py() != len(kept):
        raise RuntimeError(f"bucket {bucket}: a key stays more than once after the dedupe; this is a bug")
    return {"kept": len(kept), "key_sum": key_digest_sum(kept)}


def ledger_piece(drops: pd.DataFrame, samples: dict[int, str]) -> pd.DataFrame:
    """LEDGER_PIECE rows for dropped samples (id, stage, reason, detail, by id), their fields read from the
    samples tables of their parts (part index -> samples table)."""
    drops = drops.sort_values("id", kind="stable")
    ids = drops["id"].to_numpy(np.int64)
    part, row = split(ids)
    frames = []
    for p in np.unique(part):
        t = pd.read_parquet(samples[int(p)], columns=["source", "source_id", "url", "key"])
        frames.append(t.iloc[row[part == p]])
    fields = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=REJECT_COLUMNS[:4])
    out = fields.reset_index(drop=True).assign(
        stage=drops["stage"].to_numpy(), reason=drops["reason"].to_numpy(), detail=drops["detail"].to_numpy(), id=ids
    )
    return out[LEDGER_PIECE]


def write_ledger_piece(out: str | os.PathLike, rows: pd.DataFrame, counts: dict[str, list[int]]) -> None:
    """A parquet ledger piece; `counts` (part -> [samples, dropped]) in its metadata, for the plan."""
    table = pa.Table.from_pandas(rows[LEDGER_PIECE], preserve_index=False)
    with atomic_open(out) as f:
        pq.write_table(table.replace_schema_metadata({b"counts": json.dumps(counts).encode()}), f)


def collect_dropped(
    drop_paths: list[str], group: int, samples: list[str], parts: list[str], first_part: int, out
) -> dict:
    """The group's ledger rows from every bucket's decisions (in record order) and, per part, [samples, dropped]."""
    drops = read_bucket(drop_paths, group, DROPS).to_pandas()
    rows = ledger_piece(drops, {first_part + i: p for i, p in enumerate(samples)})
    dropped = pd.Series(part_of(rows["id"].to_numpy(np.int64))).value_counts()
    counts = {
        part: [num_rows(path), int(dropped.get(first_part + i, 0))]
        for i, (part, path) in enumerate(zip(parts, samples, strict=True))
    }
    write_ledger_piece(out, rows, counts)
    return counts


def piece_counts(path: str | os.PathLike) -> dict[str, list[int]]:
    return json.loads(pq.ParquetFile(path).metadata.metadata[b"counts"])


def dropped_ids(paths: list[str], part: int) -> np.ndarray:
    """The ids of a part's samples that the ledger pieces name (the part's rows only are read)."""
    lo, hi = part_range(part)
    found = [pq.read_table(p, columns=["id"], filters=[("id", ">=", lo), ("id", "<", hi)])["id"] for p in paths]
    return np.concatenate([c.to_numpy() for c in found]) if found else np.empty(0, np.int64)


class DroppedRows:
    """The rows left out of each part, asked for in part order, read from the ledger pieces as a stream: a
    group's piece is opened at its first part and closed after its last, a piece spanning every part (the
    near-duplicates') is read along; so one part's rows are held at a time, whatever the dataset's size."""

    def __init__(self, pieces: list[str]) -> None:
        self._of: dict[str, list[str]] = {}  # part -> the pieces that cover it
        self._last: dict[str, str] = {}  # piece -> its last part
        for path in pieces:
            parts = list(piece_counts(path))
            for part in parts:
                self._of.setdefault(part, []).append(path)
            if parts:
                self._last[path] = parts[-1]
        self._open: dict[str, tuple] = {}  # piece -> (its batches, ids read and not yet asked for)

    def _ids(self, path: str, part: int) -> np.ndarray:
        if path not in self._open:
            batches = pq.ParquetFile(path).iter_batches(columns=["id"], batch_size=65536)
            self._open[path] = (batches, np.empty(0, np.int64))
        batches, held = self._open[path]
        end = part_range(part)[1]
        while not len(held) or held[-1] < end:
            batch = next(batches, None)
            if batch is None:
                break
            held = np.concatenate([held, batch.column(0).to_numpy()])
        here = held[part_of(held) == part]
        self._open[path] = (batches, held[held >= end])
        return row_of(here)

    def __call__(self, part: int, name: str) -> np.ndarray:
        """Sorted rows of the part (`part` its index, `name` its id) that some piece names."""
        found = [self._ids(path, part) for path in self._of.get(name, [])]
        for path in self._of.get(name, []):
            if self._last[path] == name:
                self._open.pop(path, None)
        return np.unique(np.concatenate(found)) if found else np.empty(0, np.int64)


def iter_shard_ranges(
    counts: list[tuple[str, int]], samples_per_shard: int, dropped: Callable[[int, str], np.ndarray] | None = None
) -> Iterator[list[tuple[str, int, int, list[int]]]]:
    """Each shard, in order, as (part, first row, end row, rows left out between them) ranges, from each part's
    sample count (`counts`, in part order) and the rows left out of it (`dropped(index, part)`, sorted, asked
    for in part order): the shard's samples are the rows first..end of the part that are not left out. A
    range depends on its part alone, so a shard whose parts did not change gets the same ranges (and is not
    written again). One part's rows and one shard are held at a time."""
    current: list[tuple[str, int, int, list[int]]] = []
    room = samples_per_shard
    for i, (part, n) in enumerate(counts):
        gone = dropped(i, part) if dropped else np.empty(0, np.int64)
        kept = np.setdiff1d(np.arange(n), gone, assume_unique=True)
        at = 0
        while at < len(kept):
            take = kept[at : at + room]
            first, end = int(take[0]), int(take[-1]) + 1
            inside = gone[(gone >= first) & (gone < end)]
            current.append((part, first, end, inside.tolist()))
            at += len(take)
            room -= len(take)
            if room == 0:
                yield current
                current, room = [], samples_per_shard
    if current:
        yield current


def shard_ranges(
    counts: list[tuple[str, int]], samples_per_shard: int, dropped: dict[str, np.ndarray] | None = None
) -> list[list[tuple[str, int, int, list[int]]]]:
    """Every shard's ranges (iter_shard_ranges), the rows left out given per part name."""
    rows = dropped or {}
    return list(iter_shard_ranges(counts, samples_per_shard, lambda _, p: rows.get(p, np.empty(0, np.int64))))


def write_shard_files(out_dir: str | os.PathLike, name: str, ranges: list[tuple]) -> None:
    """`{name}.parts` (the parts a shard draws from, for the workflow's inputs) and `{name}.ranges.json`."""
    out_dir = Path(out_dir)
    atomic_write_text(out_dir / f"{name}.ranges.json", json.dumps([list(r) for r in ranges]) + "\n")
    atomic_write_text(out_dir / f"{name}.parts", "".join(f"{p}\n" for p in dict.fromkeys(r[0] for r in ranges)))


def write_shard_list(out_dir: str | os.PathLike, dataset: str, shards) -> list[str]:
    """write_shard_files for every shard, as they come; returns their names."""
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    names = []
    for i, ranges in enumerate(shards):
        names.append(shard_name(dataset, i))
        write_shard_files(out_dir, names[-1], ranges)
    return names


def shard_rows(ranges: list[tuple[str, int, int, list[int]]], samples: dict[str, str]) -> pd.DataFrame:
    """The shard's samples (every column of the samples tables, and `part`), in order: of each range's part,
    the rows first..end not left out."""
    frames = []
    for part, first, end, gone in ranges:
        table = pd.read_parquet(samples[part])
        rows = np.setdiff1d(np.arange(first, end), np.asarray(gone, np.int64), assume_unique=True)
        frames.append(table.iloc[rows].assign(part=part))
    return pd.concat(frames, ignore_index=True)
