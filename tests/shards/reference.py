"""Planning in one process, built from the workflow's own step functions: what the tests (and some benches) run
to plan a handful of parts without Snakemake, and the single-process readings the partitioned jobs are checked
against (every published record held at once: `published_records`, `find_published`).

No rule reaches this module: the workflow runs each step as a job of its own (rules/shards.smk). Benches import
it from the repository root as `tests.shards.reference`.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from shardsmith.core.atomic import atomic_open
from shardsmith.core.ledger import EXCLUSION_COLUMNS, REJECT_COLUMNS
from shardsmith.formats.tables import ParquetAppender, bins_for, num_rows, spill_folder
from shardsmith.shards.buckets import (
    collect_dropped,
    dropped_ids,
    find_duplicate_keys,
    shard_rows,
    split_exclusions,
    split_keys,
)
from shardsmith.shards.dedupe import NEAR_COLUMNS, REASON, STAGE, image_urls, manifest_error, published_manifests
from shardsmith.shards.neardecide import NEAR_COLUMNS as NEAR_TABLE_COLUMNS
from shardsmith.shards.neardecide import decide_near_round, write_pairs
from shardsmith.shards.neardup import (
    GONE_COLUMNS,
    NearSettings,
    decide_near_duplicates,
    split_near_entries,
    train_near_cells,
)
from shardsmith.shards.nearparts import Layout, bucket_pairs
from shardsmith.shards.plan import plan_shards
from shardsmith.shards.sampleid import published_order, row_of
from shardsmith.storage.s3 import S3Settings
from shardsmith.storage.stores import Store

PUBLISHED_COLUMNS = ["version", "key", "source_id", "url", "sha256"]


@dataclass
class Published:
    """What the search needs of the published versions: which samples of this build are already published
    (`old`: part, row, version), and the published samples no longer in it (`gone`: key, version and hashes;
    they take part as the part after the last, as keepers only)."""

    versions: list[str]
    old: pd.DataFrame
    gone: pd.DataFrame


def published_candidates(sample_paths: list[str], excluded: set[str], published: pd.DataFrame | None) -> Published:
    """Split the published records (published_records) into this build's samples already published
    and those no longer in it; a sample another stage left out counts as no longer in it."""
    if published is None or published.empty:
        return Published([], pd.DataFrame({"part": [], "row": [], "version": []}), pd.DataFrame(columns=GONE_COLUMNS))
    if "order" not in published:  # records in their published order, as published_records gives them
        published = published.assign(order=np.arange(len(published), dtype=np.int64))
    first = published.drop_duplicates("source_id")
    versions = sorted(set(first["version"]))
    index = pd.Index(first["source_id"])
    present = np.zeros(len(index), bool)
    left_out = pd.Index(sorted(excluded))
    old = []
    for p, path in enumerate(sample_paths):
        t = pd.read_parquet(path, columns=["key", "source_id"])
        keep = left_out.get_indexer(t["key"]) < 0 if len(left_out) else np.ones(len(t), bool)
        pos = index.get_indexer(t["source_id"])
        hit = keep & (pos >= 0)
        present[pos[hit]] = True
        version = first["version"].to_numpy()[pos[hit]]
        old.append(pd.DataFrame({"part": p, "row": np.flatnonzero(hit), "version": version}))
    hashed = first["phash"].notna().to_numpy() & (first["phash"] != "").to_numpy()  # older versions: no hash
    gone = first[hashed & ~present][GONE_COLUMNS].reset_index(drop=True)
    return Published(versions, pd.concat(old, ignore_index=True), gone)


# -- the published records, held at once


def _read_manifest_file(store: Store, version: str, name: str, sha256: str) -> pd.DataFrame:
    """One manifest file's PUBLISHED_COLUMNS and NEAR_COLUMNS (empty where it lacks them), checked against
    its marker."""
    data = store.read(f"{version}/{name}")
    if data is None or hashlib.sha256(data).hexdigest() != sha256:
        raise manifest_error(store, version, name)
    present = set(pq.read_schema(io.BytesIO(data)).names)
    df = pd.read_parquet(io.BytesIO(data), columns=[c for c in PUBLISHED_COLUMNS[1:] + NEAR_COLUMNS if c in present])
    for c in NEAR_COLUMNS:
        if c not in df.columns:
            df[c] = 0 if c.endswith("before") else ""
    return df


def published_records(dest: str, dataset: str, s3: S3Settings | None = None) -> pd.DataFrame:
    """key, source_id, url, sha256 (and NEAR_COLUMNS, empty where a version lacks them) of every sample in
    every complete version, oldest version first, with each record's `order` (sampleid.published_order of the
    version's index and the record's row in the version's manifest, its files read as one table). A damaged or
    replaced manifest file (its sha256 not the marker's) raises PublishedManifestError."""
    frames = []
    for v, (store, version, files) in enumerate(published_manifests(dest, dataset, s3)):
        df = pd.concat([_read_manifest_file(store, version, n, sha) for n, sha in files], ignore_index=True)
        order = published_order(v, np.arange(len(df), dtype=np.int64))
        frames.append(df.assign(version=version, order=order)[PUBLISHED_COLUMNS + NEAR_COLUMNS + ["order"]])
    if not frames:
        empty = {c: pd.Series(dtype=str) for c in PUBLISHED_COLUMNS + NEAR_COLUMNS}
        return pd.DataFrame({**empty, "order": pd.Series(dtype=np.int64)})
    return pd.concat(frames, ignore_index=True)


def already_published(samples: pd.DataFrame, published: pd.DataFrame) -> pd.DataFrame:
    """Exclusion rows for new samples (source_id never published) whose url or sha256 was published.

    `samples` needs key, source_id, url, sha256; `published` also version. The detail names the published
    sample and the earliest version that holds it. Rows come in the order of `samples`.
    """
    fresh = samples[~samples["source_id"].isin(set(published["source_id"]))]
    published = published.assign(image_url=image_urls(published))
    first_url = published[published["image_url"] != ""].drop_duplicates("image_url").set_index("image_url")
    first_sha = published.drop_duplicates("sha256").set_index("sha256")
    rows = []
    for rec in fresh.assign(image_url=image_urls(fresh))[["key", "image_url", "sha256"]].to_dict("records"):
        if rec["image_url"] and rec["image_url"] in first_url.index:
            hit, what = first_url.loc[rec["image_url"]], "url"
        elif rec["sha256"] in first_sha.index:
            hit, what = first_sha.loc[rec["sha256"]], "image sha256"
        else:
            continue
        rows.append(
            [rec["key"], STAGE, REASON, f"{what} already published as {hit['key']} in version {hit['version']}"]
        )
    return pd.DataFrame(rows, columns=EXCLUSION_COLUMNS)


def _write_table(out: str | os.PathLike, table: pd.DataFrame) -> None:
    with atomic_open(out) as f:
        table.to_parquet(f, index=False)


def write_exclusions(sample_paths: list[str], published: pd.DataFrame, out: str | os.PathLike) -> dict:
    """Write the exclusion table for the processed parts' samples against `published_records`; returns counts
    for the log."""
    cols = ["key", "source_id", "url", "sha256"]
    if published.empty:  # a first build: nothing to compare with, so no sample is read (the tables' counts only)
        _write_table(out, pd.DataFrame(columns=EXCLUSION_COLUMNS))
        n = sum(num_rows(p) for p in sample_paths)
        return {"versions": 0, "published_samples": 0, "samples": n, "kept_from_earlier_versions": 0, "excluded": 0}
    frames = [pd.read_parquet(p, columns=cols) for p in sample_paths]
    samples = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=cols)
    excluded = already_published(samples, published)
    _write_table(out, excluded)
    kept = int(samples["source_id"].isin(set(published["source_id"])).sum())
    return {
        "versions": int(published["version"].nunique()),
        "published_samples": len(published),
        "samples": len(samples),
        "kept_from_earlier_versions": kept,
        "excluded": len(excluded),
    }


def excluded_keys(exclusions: list[str]) -> pd.Index:
    """Keys other stages left out (their exclusion tables): not compared, so they keep nothing out."""
    keys = [pd.read_parquet(p, columns=["key"])["key"] for p in exclusions]
    return pd.Index(sorted(set(pd.concat(keys)))) if keys else pd.Index([])


def find_published(
    sample_paths: list[str], exclusions: list[str], dedupe: dict, out_dir: str | os.PathLike, near: bool
) -> dict:
    """The tables of shardsmith.shards.published's jobs, from every version held at once: `already_published.parquet`
    (the new records already published; empty unless dedupe["exact"]), and for the near-duplicate search which
    samples of this build are published (`old.parquet`) and which published ones are gone (`gone.parquet`),
    both empty without `near`. Returns the counts."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    published = published_records(dedupe["dest"], dedupe["dataset"], S3Settings(**dedupe["s3"]))
    out = out_dir / "already_published.parquet"
    if dedupe["exact"]:
        counts = write_exclusions(sample_paths, published, out)
    else:
        _write_table(out, pd.DataFrame(columns=EXCLUSION_COLUMNS))
        counts = {"versions": int(published["version"].nunique()), "excluded": 0}
    excluded = set(excluded_keys([*exclusions, str(out)])) if near else set()
    pub = published_candidates(sample_paths, excluded, published if near else None)
    _write_table(out_dir / "old.parquet", pub.old)
    _write_table(out_dir / "gone.parquet", pub.gone)
    return counts


# -- the near-duplicate jobs, one after another


def run_near_jobs(
    sample_paths: list[str], part_ids: list[str], s: NearSettings, dropped: list[np.ndarray], pub: Published,
    embedding_paths: list[str], layout: Layout | None, work: Path, out_dir: Path, references: bool = False,
) -> dict:  # fmt: skip
    """The near-duplicate jobs in their order, a group a part, their files under `work`; the tables into
    `out_dir` (decide_near_duplicates); returns the counts. `layout`: cells and buckets as given (default: from
    the dataset's size). `dropped`: each part's rows the steps before left out."""
    old = work / "old.parquet"
    _write_table(old, pub.old)
    n = sum(pq.ParquetFile(p).metadata.num_rows for p in sample_paths)
    cells = str(work / "cells.npz")
    used = train_near_cells(sample_paths, s, n, embedding_paths, cells, layout)
    entries, homes, compared = [], [], 0
    for i, path in enumerate(sample_paths):
        entries.append(str(work / f"{i}.entries.arrow"))
        homes.append(str(work / f"{i}.homes.arrow"))
        emb = embedding_paths[i : i + 1] if s.embedding_min_similarity is not None else []
        gone = pub.gone if i == len(sample_paths) - 1 else None  # the published records gone, with the last
        compared += split_near_entries([path], i, [dropped[i]], str(old), cells, entries[-1], homes[-1], emb,
                                     gone, len(sample_paths))  # fmt: skip
    ins, outs = [], []
    for b in range(used.buckets):
        ins.append(str(work / f"{b}.in.arrow"))
        outs.append(str(work / f"{b}.out.arrow"))
        similarity = s.embedding_min_similarity if embedding_paths else None
        pairs = bucket_pairs(entries, b, s.phash_max_distance, similarity, s.bin_size)
        write_pairs(ins[-1], outs[-1], pairs, used.buckets)
    messages: list[str] = []
    for r in range(1, s.rounds_for(used) + 1):
        sent = [str(work / f"r{r}.{p}.messages.arrow") for p in range(used.buckets)]
        for p in range(used.buckets):
            decide_near_round(ins, outs, homes, messages, p, used.buckets, sent[p], str(work / f"{p}.found.parquet"),
                         str(work / f"{p}.pending.parquet"))  # fmt: skip
        messages = sent
    found = [str(work / f"{p}.found.parquet") for p in range(used.buckets)]
    pending = [str(work / f"{p}.pending.parquet") for p in range(used.buckets)]
    return decide_near_duplicates(found, pending, messages, part_ids, s, compared, out_dir, references)


def find_near_duplicates(
    sample_paths: list[str],
    part_ids: list[str],
    s: NearSettings,
    excluded: set[str] = frozenset(),
    published: pd.DataFrame | None = None,
    embedding_paths: list[str] = (),
    layout: Layout | None = None,
    work: str | None = None,
    out_dir: str | None = None,
) -> tuple[pd.DataFrame, int]:
    """run_near_jobs on the parts, but for the samples in `excluded` (keys) and against `published`
    (published_records): the near_duplicates.parquet rows (in dataset order) and how many samples were
    compared. `layout` defaults to one cell and one bucket; the tables are left in `out_dir` when given."""
    sample_paths, embedding_paths = list(sample_paths), list(embedding_paths)
    pub = published_candidates(sample_paths, set(excluded), published)
    left_out = pd.Index(sorted(excluded))
    dropped = [
        np.flatnonzero(left_out.get_indexer(pd.read_parquet(p, columns=["key"])["key"]) >= 0)
        if len(left_out)
        else np.empty(0, np.int64)
        for p in sample_paths
    ]
    with tempfile.TemporaryDirectory(prefix="shardsmith-near-", dir=work) as tmp:
        target = Path(out_dir) if out_dir else Path(tmp)
        target.mkdir(parents=True, exist_ok=True)
        counts = run_near_jobs(sample_paths, list(part_ids), s, dropped, pub, embedding_paths,
                               layout or Layout(cells=1, buckets=1), Path(tmp), target)  # fmt: skip
        near = pd.read_parquet(target / "near_duplicates.parquet")
    for c in NEAR_TABLE_COLUMNS:
        if c not in near:
            near[c] = pd.Series(dtype=object)
    return near[NEAR_TABLE_COLUMNS], counts["samples_compared"]


# -- the whole plan


def plan_in_process(
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
    """The planning jobs of rules/shards.smk in order: split_keys, split_exclusions, find_duplicate_keys per
    bucket, collect_dropped; the near-duplicate jobs (with `near`, against `published`); plan_shards. Also
    each shard's `{name}.samples.parquet` (as write_shard makes it) and the whole ledger, `dropped.parquet`.
    Returns the shard names.

    `exclusions`: tables (key, stage, reason, detail) of samples other stages left out. `buckets`: key
    buckets (default: bins of about BIN_ROWS keys); any count gives the same files.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    samples, parts = list(samples_paths), list(part_ids)
    if buckets is None:
        buckets = bins_for(sum(pq.ParquetFile(p).metadata.num_rows for p in samples))
    near = near or NearSettings(near="off")
    with spill_folder(out_dir.parent) as tmp:
        work = Path(tmp)
        keys = [str(work / f"{i}.keys.arrow") for i in range(len(parts))]
        for i, (path, out) in enumerate(zip(samples, keys, strict=True)):
            split_keys([path], i, buckets, out)
        split_exclusions(list(exclusions), buckets, work / "excluded.arrow", tmp=str(work))
        drops = [str(work / f"{b}.drops.arrow") for b in range(buckets)]
        for b, out in enumerate(drops):
            find_duplicate_keys(keys, str(work / "excluded.arrow"), b, 1, out)
        pieces = [str(work / f"{i}.dropped.parquet") for i in range(len(parts))]
        for i, (path, part, out) in enumerate(zip(samples, parts, pieces, strict=True)):
            collect_dropped(drops, i, [path], [part], i, out)
        found = None
        if near.near != "off":
            pub = published_candidates(samples, set(excluded_keys(list(exclusions))), published)
            found = work / "near"
            found.mkdir()
            dropped = [row_of(dropped_ids([piece], i)) for i, piece in enumerate(pieces)]
            run_near_jobs(samples, parts, near, dropped, pub, list(embeddings), layout, work, found)
            pieces.append(str(found / "near_dropped.parquet"))
        names = plan_shards(pieces, out_dir, dataset=dataset, samples_per_shard=samples_per_shard, near=near,
                            found=found, log=log)  # fmt: skip
        paths = dict(zip(parts, samples, strict=True))
        for name in names:
            ranges = json.loads((out_dir / f"{name}.ranges.json").read_text())
            with atomic_open(out_dir / f"{name}.samples.parquet") as f:
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
    """plan_in_process after the records already published: left out with dedupe["exact"] (`dedupe`: dest,
    dataset, s3, exact), and compared with the near-duplicates. `samples` are the parts' samples tables,
    named `{part}.samples.parquet`. Returns the shard names."""
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
    return plan_in_process(
        samples, parts, dataset, samples_per_shard, out_dir, exclusions,
        near=near, published=published, embeddings=embeddings, log=log,
    )  # fmt: skip
