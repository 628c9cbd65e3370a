"""Shards: assign samples to uniform shards, then write each shard from the processed parts.

Samples keep the order of the parts and of the records within them, so the same inputs always give the
same shards. A key seen before anywhere in the dataset is rejected as a duplicate (the first one wins).
Every shard holds `samples_per_shard` samples except the last.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shardsmith.ledger import REJECT_COLUMNS, SHARD
from shardsmith.parts import sample_span
from shardsmith.tables import ParquetAppender, Spill, bins_for, key_bins, num_rows, spill_folder
from shardsmith.tario import (
    MEMBER_ORDER,
    HashingWriter,
    ShardWriter,
    TarMember,
    atomic_open,
    atomic_write_text,
    read_at,
)

if TYPE_CHECKING:  # pandas is imported where planning needs it: a write_shard job starts 0.3 s sooner without it
    import pandas as pd

STAGE = SHARD


def shard_name(dataset: str, index: int) -> str:
    return f"{dataset}-{index:06d}"


def _ledger_rows(samples: pd.DataFrame, stage: object, reason: object, detail: object) -> pd.DataFrame:
    """Rejection rows for samples that were processed but are left out of the shards."""
    rows = samples[["source", "source_id", "url", "key"]].reset_index(drop=True)
    return rows.assign(stage=stage, reason=reason, detail=detail)[REJECT_COLUMNS]


KEYED = pa.schema(
    [("key", pa.large_string()), ("pos", pa.int64()), ("source_id", pa.large_string()),
     ("stage", pa.large_string()), ("reason", pa.large_string()), ("detail", pa.large_string())]
)  # fmt: skip
DROPS = pa.schema(
    [("pos", pa.int64()), ("stage", pa.large_string()), ("reason", pa.large_string()), ("detail", pa.large_string())]
)


def _spill_by_key(samples_paths: list[str], exclusions: list[str], n_keys: int, n_ex: int, spill_dir: str) -> Spill:
    """Every exclusion row (numbered below zero, in order) and every sample (by dataset position), in bins by key."""
    keyed = Spill(Path(spill_dir) / "keys", n_keys, KEYED)
    at = 0
    for path in exclusions:  # exclusion rows first, numbered below zero: their order decides which counts
        for batch in pq.ParquetFile(path).iter_batches(columns=["key", "stage", "reason", "detail"], batch_size=65536):
            t = pa.Table.from_batches([batch])
            pos = pa.array(np.arange(at, at + t.num_rows, dtype=np.int64) - n_ex)
            at += t.num_rows
            null = pa.nulls(t.num_rows, pa.large_string())
            columns = [t.column("key"), pos, null, t.column("stage"), t.column("reason"), t.column("detail")]
            keyed.add(pa.Table.from_arrays(columns, names=KEYED.names), key_bins(t.column("key"), n_keys))
    at = 0
    for path in samples_paths:
        for batch in pq.ParquetFile(path).iter_batches(columns=["key", "source_id"], batch_size=65536):
            t = pa.Table.from_batches([batch])
            pos = pa.array(np.arange(at, at + t.num_rows, dtype=np.int64))
            at += t.num_rows
            null = pa.nulls(t.num_rows, pa.large_string())
            columns = [t.column("key"), pos, t.column("source_id"), null, null, null]
            keyed.add(pa.Table.from_arrays(columns, names=KEYED.names), key_bins(t.column("key"), n_keys))
    keyed.close()
    return keyed


def _decide_bin(table: pa.Table) -> list[pd.DataFrame]:
    """(pos, key, stage, reason, detail) of the samples of one key bin that drop: an excluded key's samples
    with the exclusion's reason (its first row counts), of the other samples of a key all but the first."""
    rows = table.to_pandas().sort_values("pos", kind="stable")
    is_ex = rows["pos"] < 0
    reasons = rows[is_ex].drop_duplicates("key", keep="first").set_index("key")[["stage", "reason", "detail"]]
    samples = rows[~is_ex]
    hit = samples["key"].isin(reasons.index)
    rest = samples[~hit]
    dup = rest.duplicated("key", keep="first")
    pieces = []
    if hit.any():
        pieces.append(samples[hit][["pos", "key"]].join(reasons, on="key"))
    if dup.any():
        first = rest[~dup].set_index("key")["source_id"]
        repeat = rest[dup][["pos", "key"]].assign(stage=STAGE, reason="duplicate_key")
        repeat["detail"] = ["same key as " + sid for sid in first.loc[repeat["key"]]]
        pieces.append(repeat)
    return pieces


def _decide_drops(samples_paths: list[str], exclusions: list[str], spill_dir: str) -> tuple[Spill, list[int]]:
    """Which samples leave the shards, and why, without holding the dataset.

    Every sample (key, position in the dataset) and every exclusion row (key, stage, reason, detail) is
    sorted into bins by key hash, so all rows of a key meet in one bin; each bin then decides on its own:
    an excluded key's samples drop with the exclusion's reason (its first row counts), and of the other
    samples of a key all but the first drop as duplicate_key. The decisions go to bins by dataset position
    (a run of parts each), read back part by part. Returns those bins and the first position of each.
    """
    import pandas as pd

    counts = [num_rows(p) for p in samples_paths]
    n_ex = sum(num_rows(p) for p in exclusions)
    keyed = _spill_by_key(samples_paths, exclusions, bins_for(sum(counts) + n_ex), n_ex, spill_dir)

    # decision bins by position: consecutive parts, about BIN_ROWS samples a bin
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    n_drop_bins = bins_for(int(starts[-1]))
    bounds = [0]
    for i in range(1, len(counts)):
        if len(bounds) < n_drop_bins and starts[i] - bounds[-1] >= starts[-1] / n_drop_bins:
            bounds.append(int(starts[i]))
    drops = Spill(Path(spill_dir) / "drops", len(bounds), DROPS)
    for b in range(keyed.n):
        table = keyed.read(b)
        if table.num_rows == 0 or (
            pc.min(table["pos"]).as_py() >= 0 and pc.count_distinct(table["key"]).as_py() == table.num_rows
        ):
            continue  # no exclusion and no repeated key: nothing drops, and no key becomes a Python string
        pieces = _decide_bin(table)
        if pieces:
            out = pd.concat(pieces, ignore_index=True)[["pos", "stage", "reason", "detail"]]
            drops.add(
                pa.Table.from_pandas(out, preserve_index=False),
                np.searchsorted(bounds, out["pos"].to_numpy(), side="right") - 1,
            )
    drops.close()
    return drops, bounds


# Over 60 lines: one streaming loop and the flush that shares its held rows; splitting them would pass
# that state back and forth.
def plan_shards(
    samples_paths: list[str],
    part_ids: list[str],
    dataset: str,
    samples_per_shard: int,
    out_dir: str | os.PathLike,
    exclusions: list[str] = (),
) -> list[str]:
    """Write `{name}.samples.parquet` + `{name}.parts` per shard and `dropped.parquet`; returns shard names.

    `exclusions` are parquet tables (key, stage, reason, detail) from stages that drop samples after
    processing (e.g. a similarity threshold, records already published); their samples go to the ledger
    with that reason, and the shards stay uniform.

    Streamed: one part's rows, one shard's plan and one bin of keys (about BIN_ROWS, sorted into bins on
    disk beside the plan) are held at a time, whatever the dataset's size.
    """
    import pandas as pd

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    names: list[str] = []
    pending: list[pd.DataFrame] = []
    held = 0

    def flush(final: bool) -> None:
        """Write every full shard held (and, when final, the remainder); keep the rest."""
        nonlocal pending, held
        if held < samples_per_shard and not (final and held):
            return
        rows, at = pd.concat(pending, ignore_index=True), 0
        while len(rows) - at >= samples_per_shard or (final and at < len(rows)):
            chunk = rows.iloc[at : at + samples_per_shard]
            at += len(chunk)
            name = shard_name(dataset, len(names))
            with atomic_open(out_dir / f"{name}.samples.parquet") as f:
                chunk.to_parquet(f, index=False)
            atomic_write_text(out_dir / f"{name}.parts", "".join(f"{p}\n" for p in dict.fromkeys(chunk["part"])))
            names.append(name)
        pending, held = [rows.iloc[at:]], len(rows) - at

    with (
        spill_folder(out_dir.parent) as spill_dir,
        ParquetAppender(out_dir / "dropped.parquet", REJECT_COLUMNS) as dropped,
    ):
        drops, bounds = _decide_drops(list(samples_paths), list(exclusions), spill_dir)
        loaded, decided = -1, pd.DataFrame(columns=["stage", "reason", "detail"])
        start = 0
        for part, path in zip(part_ids, samples_paths, strict=True):
            samples = pd.read_parquet(path).assign(part=part)
            b = int(np.searchsorted(bounds, start, side="right") - 1)
            if b != loaded:  # the decisions of the next run of parts
                decided, loaded = drops.read(b).to_pandas().set_index("pos"), b
            pos = np.arange(start, start + len(samples))
            start += len(samples)
            out = np.isin(pos, decided.index.to_numpy())
            if out.any():  # in record order
                why = decided.loc[pos[out]]
                dropped.append(
                    _ledger_rows(samples[out], why["stage"].values, why["reason"].values, why["detail"].values)
                )
            keep = samples[~out]
            if len(keep):
                pending.append(keep)
                held += len(keep)
            flush(final=False)
        flush(final=True)
    return names


MEMBERS = pa.schema([("key", pa.string()), ("ext", pa.string()), ("offset", pa.int64()), ("size", pa.int64())])


def write_members(path: str | os.PathLike, members: list[TarMember]) -> None:
    """A shard's member table (key, ext, data offset, size; in tar order): what the loaders' indexes are made of."""
    columns = list(zip(*members, strict=True)) if members else [[], [], [], []]
    table = pa.Table.from_arrays([pa.array(c, t) for c, t in zip(columns, MEMBERS.types, strict=True)], schema=MEMBERS)
    with atomic_open(path) as f:
        pq.write_table(table, f)


def read_members(path: str | os.PathLike) -> list[TarMember]:
    t = pq.read_table(path, schema=MEMBERS).to_pydict()
    return [TarMember(*row) for row in zip(t["key"], t["ext"], t["offset"], t["size"], strict=True)]


def write_shard(
    plan_path: str, part_tars: dict[str, str], out_tar: str, out_info: str, out_members: str | None = None
) -> dict:
    """Copy the planned samples from the processed part tars into one deterministic shard.

    download_part's processor wrote each sample's members back to back with the shard's own header format, so runs of
    samples that lie one after another in a part (the usual case: nothing dropped between them) are copied
    as byte ranges; the rest member by member. Either way the bytes are the same. `out_members` gets where
    each member landed in the shard (write_members), known as it is written: the loaders' indexes need it.
    """
    plan = pq.ParquetFile(plan_path).read().to_pylist()
    members: list[TarMember] = []
    with contextlib.ExitStack() as stack:
        out = HashingWriter(stack.enter_context(atomic_open(out_tar)), ("md5", "sha256"))  # hashed as written
        tar = stack.enter_context(ShardWriter(out))
        needed = {row["part"] for row in plan}
        sources = {part: stack.enter_context(open(path, "rb")) for part, path in part_tars.items() if part in needed}
        run: list = []  # [part, start, end, keys, rows] of samples still to copy as one range

        def copy_run() -> None:
            if run:
                base = tar.offset - run[1]  # a part offset in the range + base = the shard offset
                for r in run[4]:
                    members.extend(
                        TarMember(r["key"], e, r[f"{e}_offset"] + base, r[f"{e}_size"]) for e in MEMBER_ORDER
                    )
                tar.copy_samples(sources[run[0]], run[1], run[2], run[3])
                run.clear()

        for row in plan:
            span = sample_span(row)
            if span is None:  # not laid out as the processor writes: member by member
                copy_run()
                src = sources[row["part"]]
                data = {ext: read_at(src, row[f"{ext}_offset"], row[f"{ext}_size"]) for ext in MEMBER_ORDER}
                where = tar.write(row["key"], data)
                members.extend(
                    sorted((TarMember(row["key"], e, o, n) for e, (o, n) in where.items()), key=lambda m: m.offset)
                )
            elif run and run[0] == row["part"] and run[2] == span[0]:
                run[2] = span[1]
                run[3].append(row["key"])
                run[4].append(row)
            else:
                copy_run()
                run.extend([row["part"], span[0], span[1], [row["key"]], [row]])
        copy_run()
    digests = out.hexdigests()
    info = {
        "shard": os.path.basename(out_tar),
        "nsamples": len(plan),
        "filesize": os.path.getsize(out_tar),
        "md5sum": digests["md5"],
        "sha256": digests["sha256"],
    }
    atomic_write_text(out_info, json.dumps(info, indent=1, sort_keys=True) + "\n")
    if out_members is not None:
        write_members(out_members, members)
    return info
