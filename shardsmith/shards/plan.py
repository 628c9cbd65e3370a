"""Shard planning: assign samples to uniform shards, after the exclusions that see the whole dataset.

Samples keep the order of the parts and of the records within them, so the same inputs always give the
same shards. A key seen before anywhere in the dataset is rejected as a duplicate (the first one wins).
Every shard holds `samples_per_shard` samples except the last.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from shardsmith.core.atomic import atomic_open
from shardsmith.core.ledger import REJECT_COLUMNS
from shardsmith.formats.names import shard_name
from shardsmith.formats.tables import ParquetAppender, bins_for, spill_folder
from shardsmith.shards.buckets import (
    DroppedRows,
    bucket_drops,
    dropped_ids,
    group_drops,
    iter_shard_ranges,
    piece_counts,
    shard_rows,
    split_exclusions,
    split_keys,
    write_shard_files,
    write_shard_list,
)
from shardsmith.shards.dedupe import published_records, write_exclusions
from shardsmith.shards.neardup import NearSettings, excluded_keys, published_candidates, run_near_jobs
from shardsmith.shards.nearparts import Layout
from shardsmith.shards.sampleid import row_of
from shardsmith.storage.s3 import S3Settings


def copy_near_tables(found: str | os.PathLike, out_dir: str | os.PathLike) -> dict:
    """near_duplicates.parquet and .json beside the plan, where the report and the card read them; the counts."""
    for name in ("near_duplicates.parquet", "near_duplicates.json"):
        with atomic_open(Path(out_dir) / name) as f:
            f.write((Path(found) / name).read_bytes())
    return json.loads((Path(out_dir) / "near_duplicates.json").read_text())


def part_counts(pieces: list[str]) -> list[tuple[str, int]]:
    """Each part's samples, in part order, from the ledger pieces' counts (part -> [samples, dropped])."""
    total: dict[str, int] = {}
    for path in pieces:
        for part, (n, _) in piece_counts(path).items():
            total[part] = total.get(part, 0) + n
    return list(total.items())


def shards_from_pieces(pieces: list[str], samples_per_shard: int) -> Iterator[list[tuple]]:
    """Every shard's ranges (shardsmith.shards.buckets.iter_shard_ranges), as they come, from the ledger pieces:
    their counts, and the rows they name read as a stream (DroppedRows)."""
    return iter_shard_ranges(part_counts(pieces), samples_per_shard, DroppedRows(pieces))


def plan_from_counts(
    pieces: list[str],
    out_dir: str | os.PathLike,
    *,
    dataset: str,
    samples_per_shard: int,
    near: NearSettings,
    found: str | os.PathLike | None,
    log: Callable[[str], None] = print,
) -> list[str]:
    """The workflow's plan_shards: each shard's ranges from the parts' kept counts, which the ledger pieces
    (the groups' first, in part order, then the near-duplicates') carry; memory grows with parts and shards."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if found is not None:
        got = copy_near_tables(found, out_dir)
        left = "left out" if near.near == "exclude" else "reported, all kept (dedupe.near: report)"
        log(f"near-duplicates: {got['near_duplicates']} samples in {got['groups']} groups {left}")
    names = write_shard_list(out_dir, dataset, shards_from_pieces(list(pieces), samples_per_shard))
    log(f"{len(names)} shards of at most {samples_per_shard} samples")
    return names


def _near_in_process(
    samples: list[str], parts: list[str], pieces: list[str], near: NearSettings, exclusions: list[str],
    published: pd.DataFrame | None, embeddings: list[str], layout: Layout | None, work: Path,
) -> str:  # fmt: skip
    """The near-duplicate jobs in order, in this process: returns the folder with their tables."""
    pub = published_candidates(samples, set(excluded_keys(exclusions)), published)
    near_dir = work / "near"
    near_dir.mkdir()
    dropped = [row_of(dropped_ids([piece], i)) for i, piece in enumerate(pieces)]
    run_near_jobs(samples, parts, near, dropped, pub, embeddings, layout, work, near_dir)
    return str(near_dir)


# In one process, the steps the workflow runs as jobs (rules/shards.smk): split_keys, split_exclusions,
# find_duplicate_keys per bucket, collect_dropped; the near-duplicate jobs; then plan_shards.
def plan_shards(
    samples_paths: list[str],
    part_ids: list[str],
    dataset: str,
    samples_per_shard: int,
    out_dir: str | os.PathLike,
    exclusions: list[str] = (),
    buckets: int | None = None,
    near: NearSettings | None = None,
    published: pd.DataFrame | None = None,
    embeddings: list[str] = (),
    layout: Layout | None = None,
    log: Callable[[str], None] = print,
) -> list[str]:
    """Write `{name}.samples.parquet`, `{name}.parts` and `{name}.ranges.json` per shard and `dropped.parquet`
    (and the near-duplicate tables, with `near`); returns shard names.

    `exclusions` are parquet tables (key, stage, reason, detail) from stages that drop samples after
    processing (e.g. a similarity threshold, records already published); their samples go to the ledger
    with that reason, and the shards stay uniform. Keys repeated across parts: all but the first drop.
    Then near-duplicates among the samples left (`near`, against `published`). Decided per bucket
    (shardsmith.shards.buckets, shardsmith.shards.nearparts): any `buckets` gives the same files.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    samples, parts = list(samples_paths), list(part_ids)
    if buckets is None:  # buckets of about BIN_ROWS keys: one held at a time
        buckets = bins_for(sum(pq.ParquetFile(p).metadata.num_rows for p in samples))
    with spill_folder(out_dir.parent) as tmp:
        work = Path(tmp)
        keys = [str(work / f"{i}.keys.arrow") for i in range(len(parts))]  # a group a part: one held at a time
        for i, (path, out) in enumerate(zip(samples, keys, strict=True)):
            split_keys([path], i, buckets, out)
        split_exclusions(list(exclusions), buckets, work / "excluded.arrow", tmp=str(work))
        drops = [str(work / f"{b}.drops.arrow") for b in range(buckets)]
        for b, out in enumerate(drops):
            bucket_drops(keys, str(work / "excluded.arrow"), b, 1, out)
        pieces = [str(work / f"{i}.dropped.parquet") for i in range(len(parts))]
        for i, (path, part, out) in enumerate(zip(samples, parts, pieces, strict=True)):
            group_drops(drops, i, [path], [part], i, out)
        if near is not None and near.near != "off":
            found = _near_in_process(samples, parts, pieces, near, list(exclusions), published, list(embeddings),
                                     layout, work)  # fmt: skip
            pieces.append(str(Path(found) / "near_dropped.parquet"))
            got = copy_near_tables(found, out_dir)
            left = "left out" if near.near == "exclude" else "reported, all kept (dedupe.near: report)"
            log(f"near-duplicates: {got['near_duplicates']} samples in {got['groups']} groups {left}")
        names, paths = [], dict(zip(parts, samples, strict=True))
        for i, ranges in enumerate(shards_from_pieces(pieces, samples_per_shard)):
            names.append(shard_name(dataset, i))
            write_shard_files(out_dir, names[-1], ranges)
            with atomic_open(out_dir / f"{names[-1]}.samples.parquet") as f:
                shard_rows(ranges, paths).to_parquet(f, index=False)
        with ParquetAppender(out_dir / "dropped.parquet", REJECT_COLUMNS) as ledger:
            for piece in pieces:
                ledger.append(pq.read_table(piece, columns=REJECT_COLUMNS))
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
    log: Callable[[str], None] = print,
) -> list[str]:
    """The whole plan in one process, in its order: records already published left out (`dedupe`), repeated
    keys, then near-duplicate images (reported, or left out with `near.near: exclude`), then the shards.

    `samples` are the parts' samples tables, named `{part}.samples.parquet`; `exclusions` the tables of
    samples other steps left out. Returns the shard names.
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
    return plan_shards(
        samples, parts, dataset, samples_per_shard, out_dir, exclusions,
        near=near, published=published, embeddings=embeddings, log=log,
    )  # fmt: skip
