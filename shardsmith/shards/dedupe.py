"""Records already published: keep the old ones, leave out new ones that repeat a published image.

A scheduled refresh rebuilds from the grown source. Records of the previous versions (same `source_id`)
stay in the new version. A NEW record whose URL or image sha256 equals a sample published in any complete
version still on the destination is written to an exclusion table (key, stage, reason, detail);
plan_shards leaves it out and it lands in the ledger as `dedupe/already_published`. So the new version
holds old plus new records, with no image published twice across versions.
"""

import hashlib
import io
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from shardsmith.core.atomic import atomic_open
from shardsmith.core.ledger import DEDUPE, EXCLUSION_COLUMNS
from shardsmith.formats.tables import num_rows
from shardsmith.shards.sampleid import published_order
from shardsmith.storage.s3 import S3Settings
from shardsmith.storage.stores import Store, complete_versions, open_store

STAGE = DEDUPE
REASON = "already_published"
PUBLISHED_COLUMNS = ["version", "key", "source_id", "url", "sha256"]
# read too where a version has them (the near-duplicate step compares them; older versions lack the hashes)
NEAR_COLUMNS = ["width_before", "height_before", "phash", "phash_mirror"]
# a version's manifest: one file, or (newer versions) a folder of one piece per shard, read in name order
MANIFEST = "manifest.parquet"


class PublishedManifestError(RuntimeError):
    pass


def _is_piece(name: str) -> bool:
    folder, _, piece = name.rpartition("/")
    return folder == MANIFEST and piece.endswith(".parquet")


def manifest_files(marker: dict) -> list[tuple[str, str]]:
    """(name in the version, sha256 its marker records) of a version's manifest files, in manifest order: the
    single `manifest.parquet`, or the `*.parquet` pieces of a `manifest.parquet/` folder in name order (as
    formats.tables.table_files reads a table written in pieces); none where the version has no manifest."""
    files = marker["files"]
    names = [MANIFEST] if MANIFEST in files else sorted(n for n in files if _is_piece(n))
    return [(n, files[n]["sha256"]) for n in names]


def published_manifests(
    dest: str, dataset: str, s3: S3Settings | None = None
) -> Iterator[tuple[Store, str, list[tuple[str, str]]]]:
    """(store, version, its manifest_files) of every complete version that has a manifest, oldest first.

    A version listing both a manifest file and pieces (possible on S3 only) stops the refresh: reading
    either would guess which records it published."""
    store = open_store(dest, dataset, s3)
    for version, marker in complete_versions(dest, dataset, s3).items():
        if MANIFEST in marker["files"] and any(map(_is_piece, marker["files"])):
            raise PublishedManifestError(
                f"{store.where(version)} holds both a {MANIFEST} file and a {MANIFEST}/ folder of pieces"
            )
        if files := manifest_files(marker):
            yield store, version, files


def manifest_error(store: Store, version: str, name: str = MANIFEST) -> PublishedManifestError:
    return PublishedManifestError(f"{store.where(version)}/{name} is missing or differs from its {version} marker")


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
    every complete version, oldest version first, with each record's `order` (the version's index <<
    sampleid.ORDER_BITS | its row in the version's manifest, its files read as one table).

    Each manifest file is checked against the sha256 its completion marker records: a damaged or replaced
    manifest stops the refresh instead of letting duplicates through.
    """
    frames = []
    for v, (store, version, files) in enumerate(published_manifests(dest, dataset, s3)):
        df = pd.concat([_read_manifest_file(store, version, n, sha) for n, sha in files], ignore_index=True)
        order = published_order(v, np.arange(len(df), dtype=np.int64))
        frames.append(df.assign(version=version, order=order)[PUBLISHED_COLUMNS + NEAR_COLUMNS + ["order"]])
    if not frames:
        empty = {c: pd.Series(dtype=str) for c in PUBLISHED_COLUMNS + NEAR_COLUMNS}
        return pd.DataFrame({**empty, "order": pd.Series(dtype=np.int64)})
    return pd.concat(frames, ignore_index=True)


def image_urls(df: pd.DataFrame) -> pd.Series:
    """The URL that names each sample's image: for a member of a source shard (source_id `{shard url}#{member}`)
    that is the source_id, since every member shares the shard's URL."""
    url = df["url"].fillna("").astype(str)
    sid = df["source_id"].astype(str)
    in_shard = [s.startswith(u + "#") for u, s in zip(url, sid, strict=True)]
    return url.where(~pd.Series(in_shard, index=df.index, dtype=bool), sid)


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


def find_published(
    sample_paths: list[str], exclusions: list[str], dedupe: dict, out_dir: str | os.PathLike, near: bool
) -> dict:
    """The published versions read at once, in one process: `already_published.parquet` (the new records
    already published, empty unless dedupe exact), and for the near-duplicate search which samples of this
    build are published and which published ones are gone (shardsmith.shards.neardup.Published). The
    workflow's partitioned jobs (shardsmith.shards.published) give these tables row for row without holding
    a version; this is the reference they are tested against, fine for a few million records."""
    from shardsmith.shards.neardup import excluded_keys, published_candidates, write_published

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    published = published_records(dedupe["dest"], dedupe["dataset"], S3Settings(**dedupe["s3"]))
    out = out_dir / "already_published.parquet"
    if dedupe["exact"]:
        counts = write_exclusions(sample_paths, published, out)
    else:
        _write_table(out, pd.DataFrame(columns=EXCLUSION_COLUMNS))
        counts = {"versions": int(published["version"].nunique()), "excluded": 0}
    # which samples are published, for the near-duplicate search (none without it: the outputs stay whole)
    excluded = set(excluded_keys([*exclusions, str(out)])) if near else set()
    candidates = published_candidates(sample_paths, excluded, published if near else None)
    write_published(candidates, out_dir / "old.parquet", out_dir / "gone.parquet")
    return counts
