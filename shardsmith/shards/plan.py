"""Shard planning: assign samples to uniform shards, after the exclusions that see the whole dataset.

Samples keep the order of the parts and of the records within them, so the same inputs always give the
same shards. A key seen before anywhere in the dataset is rejected as a duplicate (the first one wins).
Every shard holds `samples_per_shard` samples except the last.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shardsmith.core.atomic import atomic_open, atomic_write_text
from shardsmith.core.ledger import REJECT_COLUMNS, SHARD
from shardsmith.formats.names import shard_name
from shardsmith.formats.tables import ParquetAppender, Spill, bins_for, key_bins, num_rows, spill_folder
from shardsmith.shards.dedupe import published_records, write_exclusions
from shardsmith.shards.neardup import NearSettings, find_near_duplicates, write_tables
from shardsmith.shards.neardup import summary as near_summary
from shardsmith.storage.s3 import S3Settings

STAGE = SHARD


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


def plan_dataset(
    samples: list[str],
    out_dir: str | os.PathLike,
    *,
    dataset: str,
    samples_per_shard: int,
    exclusions: list[str],
    dedupe: dict | None,
    near: NearSettings,
    embeddings: list[str],
    scratch: str | None,
    found: str | os.PathLike | None = None,
    log: Callable[[str], None] = print,
) -> list[str]:
    """The whole plan, in its order: records already published left out (`dedupe`), then near-duplicate images
    found (reported, or left out with `near.near: exclude`), then the rest assigned to shards (plan_shards).

    `samples` are the parts' samples tables, named `{part}.samples.parquet`; `exclusions` the tables of
    samples other steps left out. `found`: the folder where the workflow's jobs already found the
    near-duplicates (decide_near_duplicates); without it they are searched here, in one process. Returns the
    shard names.
    """
    parts = [Path(p).name.split(".")[0] for p in samples]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    exclusions = list(exclusions)
    published = None
    if dedupe:
        published = published_records(dedupe["dest"], dedupe["dataset"], S3Settings(**dedupe["s3"]))
    if dedupe and dedupe["exact"]:
        out = out_dir / "already_published.parquet"
        n = write_exclusions(samples, published, out)
        exclusions.append(str(out))
        log(
            f"{n['samples']} samples: {n['kept_from_earlier_versions']} kept from {n['versions']} published versions, "
            f"{n['excluded']} new ones already published (url or image sha256) left out"
        )
    if near.near != "off":
        if found is None:
            excluded = (
                set(pd.concat([pd.read_parquet(p, columns=["key"])["key"] for p in exclusions]))
                if exclusions
                else set()
            )
            rows, compared = find_near_duplicates(samples, parts, near, excluded, published, embeddings, scratch)
            exclusions += write_tables(rows, out_dir, exclude=near.near == "exclude")
            counts = near_summary(rows, compared)
            atomic_write_text(
                out_dir / "near_duplicates.json", json.dumps({**counts, "settings": vars(near)}, indent=1) + "\n"
            )
        else:  # the report and the card read them beside the plan
            for name in ("near_duplicates.parquet", "near_duplicates.json"):
                with atomic_open(out_dir / name) as f:
                    f.write((Path(found) / name).read_bytes())
            near_out = str(Path(found) / "near_exclusions.parquet")
            if near.near == "exclude" and near_out not in exclusions:
                exclusions.append(near_out)
            counts = json.loads((out_dir / "near_duplicates.json").read_text())
        left = "left out" if near.near == "exclude" else "reported, all kept (dedupe.near: report)"
        log(f"near-duplicates: {counts['near_duplicates']} samples in {counts['groups']} groups {left}")
    return plan_shards(
        samples,
        part_ids=parts,
        dataset=dataset,
        samples_per_shard=samples_per_shard,
        out_dir=out_dir,
        exclusions=exclusions,
    )
