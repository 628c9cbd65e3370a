"""Records already published (scheduled refreshes), found by partitioned jobs: no job holds a version.

`fetch_published` copies every complete version's manifest (its manifest.parquet, or the pieces of a
manifest.parquet/ folder: dedupe.manifest_files) into the work folder once, streaming, each file checked
against the sha256 its completion marker records (a damaged or replaced one stops the refresh), and lists
the versions, oldest first. A record is looked up by three values: its source_id, its image's url
(dedupe.image_urls; empty urls are not looked up) and its image's sha256, each hashed to 128 bits.
`split_published` takes a slice of every version's row groups and writes each record's lookups to the
bucket of their hash, one batch per bucket; `split_lookups` does the same for a group's samples. A bucket
job (`match_published`) sees every record and sample of its hashes: the first published record of a value
(oldest version, then manifest order) is the one that counts. A sample whose source_id it holds was
published before; one whose url or sha256 it holds is a hit, sent to the sample's group; a published
source_id that no sample kept by the other steps has, with a pHash, is `gone` (the near-duplicate search
keeps it as a keeper only). Each group's job (`collect_published`) gathers its samples' rows from every
bucket: its `old` rows (part, row, version), and, for samples whose source_id was never published, an
exclusion when their url (else their sha256) was, naming the record. Which bucket a value lands in decides
nothing, so any bucket count gives the same tables, row for row (tests/shards/test_published.py checks them
against one job holding every version).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from shardsmith.core.atomic import atomic_open, atomic_write_text, sha256_file
from shardsmith.core.ledger import EXCLUSION_COLUMNS
from shardsmith.formats.shuffle import cut, read_bucket, write_buckets
from shardsmith.shards.buckets import group_of
from shardsmith.shards.dedupe import (
    MANIFEST,
    NEAR_COLUMNS,
    REASON,
    STAGE,
    image_urls,
    manifest_error,
    published_manifests,
)
from shardsmith.shards.neardup import GONE_COLUMNS
from shardsmith.shards.sampleid import part_of, published_order, row_of, sample_ids
from shardsmith.storage.s3 import S3Settings
from shardsmith.storage.stores import Store

SOURCE_ID, URL, SHA256 = 0, 1, 2  # what a lookup value is
WHAT = {URL: "url", SHA256: "image sha256"}  # as the exclusion's detail names it
HASH_KEYS = ("shardsmith-pubA1", "shardsmith-pubB2")  # two 64-bit SipHashes: 128 bits, no collision at 5.85B
VERSIONS = "versions.json"

PUBLISHED = pa.schema(
    [("kind", pa.int8()), ("h1", pa.uint64()), ("h2", pa.uint64()), ("order", pa.int64()),
     ("key", pa.large_string()), ("version", pa.large_string()), ("width_before", pa.int64()),
     ("height_before", pa.int64()), ("phash", pa.large_string()), ("phash_mirror", pa.large_string()),
     ("group", pa.int32())]
)  # fmt: skip
LOOKUPS = pa.schema(
    [("kind", pa.int8()), ("h1", pa.uint64()), ("h2", pa.uint64()), ("id", pa.int64()), ("kept", pa.bool_())]
)
MATCHES = pa.schema(
    [("id", pa.int64()), ("kind", pa.int8()), ("kept", pa.bool_()), ("key", pa.large_string()),
     ("version", pa.large_string())]
)  # fmt: skip
GONE = pa.schema(
    [("key", pa.large_string()), ("version", pa.large_string()), ("width_before", pa.int64()),
     ("height_before", pa.int64()), ("phash", pa.large_string()), ("phash_mirror", pa.large_string()),
     ("order", pa.int64())]
)  # fmt: skip
OLD = ["part", "row", "version"]


def value_hashes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two 64-bit hashes of each string (pandas' SipHash with two keys): one lookup value, 128 bits."""
    return tuple(pd.util.hash_array(values, hash_key=k, categorize=False) for k in HASH_KEYS)


def fetch_published(dest: str, dataset: str, s3: S3Settings, out_dir: str | os.PathLike) -> list[str]:
    """Every complete version's manifest files in out_dir, oldest first (version v's in `{v:05d}/`, see
    version_folder), and versions.json naming the versions with each file's row groups and rows; returns the
    versions. A file is streamed to disk, never held."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    versions, row_groups, rows = [], [], []
    for store, version, files in published_manifests(dest, dataset, s3):
        groups, counts = _fetch_version(store, version, files, version_folder(out_dir, len(versions)))
        versions.append(version)
        row_groups.append(groups)
        rows.append(counts)
    listing = {"versions": versions, "row_groups": row_groups, "rows": rows}
    atomic_write_text(out_dir / VERSIONS, json.dumps(listing) + "\n")
    return versions


def version_folder(manifest_dir: str | os.PathLike, v: int) -> Path:
    """Where fetch_published copies the v-th version's manifest files, `{i:06d}.parquet` in manifest order."""
    return Path(manifest_dir, f"{v:05d}")


def _file_name(i: int) -> str:
    return f"{i:06d}.parquet"


def _fetch_version(
    store: Store, version: str, files: list[tuple[str, str]], folder: Path
) -> tuple[list[int], list[int]]:
    """A version's manifest files copied into `folder`, all or none: they land in a temporary folder beside
    it (`.{name}.{random}.partial`, cleaned after a kill) renamed into place once each matched its marker.
    Returns each file's row groups and rows."""
    tmp = folder.parent / f".{folder.name}.{os.urandom(4).hex()}.partial"
    tmp.mkdir()
    try:
        groups, counts = [], []
        pieces = files[0][0] != MANIFEST
        if pieces:  # a folder of pieces (one per shard: 117,000 at LAION-5B) copied at once, then each checked
            store.copy_folder(f"{version}/{MANIFEST}", tmp / "pieces")
        for i, (name, sha256) in enumerate(files):
            path = tmp / _file_name(i)
            if pieces:
                got = tmp / "pieces" / name.split("/", 1)[1]
                if not got.is_file() or sha256_file(got) != sha256:
                    raise manifest_error(store, version, name)
                os.rename(got, path)
            else:
                with open(path, "wb") as f:
                    if store.copy_to(f"{version}/{name}", f) != sha256:
                        raise manifest_error(store, version, name)
                    f.flush()
                    os.fsync(f.fileno())
            meta = pq.ParquetFile(path).metadata
            groups.append(meta.num_row_groups)
            counts.append(meta.num_rows)
        shutil.rmtree(tmp / "pieces", ignore_errors=True)  # files below the folder its marker does not list
        if folder.exists():
            shutil.rmtree(folder)
        os.rename(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return groups, counts


def _published_rows(t: pd.DataFrame, version: str, order: np.ndarray, group: int) -> pa.Table:
    """A manifest chunk's lookups: its source_ids (with the near-duplicate columns), urls and sha256s."""
    for c in NEAR_COLUMNS:
        if c not in t.columns:
            t[c] = 0 if c.endswith("before") else ""
    url = image_urls(t).to_numpy(object)
    has_url = url != ""
    values = [t["source_id"].astype(str).to_numpy(object), url[has_url], t["sha256"].astype(str).to_numpy(object)]
    picks = [np.arange(len(t)), np.flatnonzero(has_url), np.arange(len(t))]
    tables = []
    for kind, (vals, pick) in enumerate(zip(values, picks, strict=True)):
        h1, h2 = value_hashes(vals)
        near = kind == SOURCE_ID
        rows = {
            "kind": np.full(len(pick), kind, np.int8), "h1": h1, "h2": h2, "order": order[pick],
            "key": t["key"].astype(str).to_numpy(object)[pick], "version": np.full(len(pick), version, object),
            "width_before": t["width_before"].fillna(0).to_numpy(np.int64)[pick] if near else None,
            "height_before": t["height_before"].fillna(0).to_numpy(np.int64)[pick] if near else None,
            "phash": t["phash"].fillna("").astype(str).to_numpy(object)[pick] if near else None,
            "phash_mirror": t["phash_mirror"].fillna("").astype(str).to_numpy(object)[pick] if near else None,
            "group": np.full(len(pick), group, np.int32),
        }  # fmt: skip
        tables.append(
            pa.table(
                {k: v if v is not None else pa.nulls(len(pick), PUBLISHED.field(k).type) for k, v in rows.items()}
            ).cast(PUBLISHED)
        )
    return pa.concat_tables(tables)


def _file_rows(path: Path, version: str, v: int, group: int, start: int, end: int, row: int) -> list[pa.Table]:
    """The lookups of row groups start..end of one of version v's manifest files, whose first row is the
    version's row `row`."""
    with pq.ParquetFile(path) as f:
        row += sum(f.metadata.row_group(j).num_rows for j in range(start))
        present = set(f.schema_arrow.names)
        columns = [c for c in ["key", "source_id", "url", "sha256", *NEAR_COLUMNS] if c in present]
        tables = []
        for j in range(start, end):
            t = f.read_row_group(j, columns=columns).to_pandas()
            order = published_order(v, np.arange(row, row + len(t), dtype=np.int64))
            row += len(t)
            tables.append(_published_rows(t, version, order, group))
    return tables


def split_published(
    manifest_dir: str | os.PathLike, group: int, groups: int, buckets: int, out: str | os.PathLike
) -> int:
    """Group `group`'s share (of `groups`) of every version's manifest, about a group's samples of row groups
    a version, as one batch per bucket; returns the records read. A version's files are one sequence of row
    groups, its rows numbered on across them (the `order` one file of those rows gives), and only the files
    holding the group's share are opened."""
    listing = json.loads(Path(manifest_dir, VERSIONS).read_text())
    if "row_groups" not in listing:  # copied before versions could be folders of pieces (a refresh's params change)
        raise ValueError(f"{manifest_dir} was fetched by an older shardsmith: rerun with --forcerun fetch_published")
    tables = []
    for v, version in enumerate(listing["versions"]):
        row_groups, counts = listing["row_groups"][v], listing["rows"][v]
        total = sum(row_groups)
        lo, hi = group * total // groups, (group + 1) * total // groups
        first, row = 0, 0  # the version's index of file i's first row group, and of its first row
        for i, (n, rows) in enumerate(zip(row_groups, counts)):
            if max(lo, first) < min(hi, first + n):
                path = version_folder(manifest_dir, v) / _file_name(i)
                tables += _file_rows(path, version, v, group, max(lo - first, 0), min(hi - first, n), row)
            first, row = first + n, row + rows
    table = pa.concat_tables(tables) if tables else PUBLISHED.empty_table()
    bins = (table["h1"].to_numpy() % np.uint64(buckets)).astype(np.int64)
    write_buckets(out, PUBLISHED, cut(table, bins, buckets))
    return int(np.sum(table["kind"].to_numpy() == SOURCE_ID))


def split_lookups(
    samples: list[str], first_part: int, buckets: int, exclusions: list[str], out: str | os.PathLike
) -> int:
    """The lookups of a group's samples (by sample id), one batch per bucket; `kept` is False for a
    sample its group's exclusion tables leave out (its own parts' low similarity scores), which then does
    not keep its published record from being gone. Only the group's own tables: every group reading every
    table would read the dataset's exclusions once a group. Returns the samples."""
    tables = []
    excluding = [p for p in exclusions if pq.ParquetFile(p).metadata.num_rows]  # an empty one has untyped columns
    for i, path in enumerate(samples):
        t = pd.read_parquet(path, columns=["key", "source_id", "url", "sha256"])
        ids = sample_ids(first_part + i, np.arange(len(t)))
        kept = np.ones(len(t), bool)
        if excluding and len(t):
            keys = t["key"].astype(str).tolist()
            left_out = [pq.read_table(p, columns=["key"], filters=[("key", "in", keys)])["key"] for p in excluding]
            kept = ~t["key"].isin(set(pa.chunked_array(left_out).to_pylist())).to_numpy()
        url = image_urls(t).to_numpy(object)
        has_url = url != ""
        values = [t["source_id"].astype(str).to_numpy(object), url[has_url], t["sha256"].astype(str).to_numpy(object)]
        picks = [np.arange(len(t)), np.flatnonzero(has_url), np.arange(len(t))]
        for kind, (vals, pick) in enumerate(zip(values, picks, strict=True)):
            h1, h2 = value_hashes(vals)
            tables.append(
                pa.table(
                    {"kind": np.full(len(pick), kind, np.int8), "h1": h1, "h2": h2, "id": ids[pick], "kept": kept[pick]}
                ).cast(LOOKUPS)  # fmt: skip
            )
    table = pa.concat_tables(tables) if tables else LOOKUPS.empty_table()
    bins = (table["h1"].to_numpy() % np.uint64(buckets)).astype(np.int64)
    write_buckets(out, LOOKUPS, cut(table, bins, buckets))
    return sum(pq.ParquetFile(p).metadata.num_rows for p in samples)


def match_published(
    published: list[str], lookups: list[str], bucket: int, groups: int, parts_per_group: int,
    out_matches: str | os.PathLike, out_gone: str | os.PathLike, near: bool = True,
) -> dict:  # fmt: skip
    """A bucket's decisions: each sample's match with the first published record of its values (one batch
    per group) and the published source_ids gone from the build (none without the near-duplicate search;
    one batch per group: the group whose share of the manifests split_published read them in); returns counts."""
    pub = read_bucket(published, bucket, PUBLISHED).to_pandas()
    smp = read_bucket(lookups, bucket, LOOKUPS).to_pandas()
    first = pub.sort_values("order", kind="stable").drop_duplicates(["kind", "h1", "h2"])
    m = smp.merge(first[["kind", "h1", "h2", "key", "version"]], on=["kind", "h1", "h2"], how="inner")
    m = m.sort_values(["id", "kind"], kind="stable")
    matches = pa.Table.from_pandas(m[MATCHES.names], preserve_index=False).cast(MATCHES)
    write_buckets(out_matches, MATCHES, cut(matches, group_of(m["id"].to_numpy(), parts_per_group), groups))
    sources = first[first["kind"] == SOURCE_ID]
    kept = smp[(smp["kind"] == SOURCE_ID) & smp["kept"]][["h1", "h2"]].drop_duplicates()
    present = sources.merge(kept, on=["h1", "h2"], how="left", indicator=True)["_merge"].eq("both").to_numpy()
    hashed = (sources["phash"].fillna("") != "").to_numpy()
    gone = sources[hashed & ~present & near].sort_values("order")
    table = pa.Table.from_pandas(gone[GONE.names], preserve_index=False).cast(GONE)
    write_buckets(out_gone, GONE, cut(table, gone["group"].to_numpy(np.int64), groups))  # by the group that read it
    return {"published": len(pub), "samples": len(smp), "matched": len(m), "gone": len(gone)}


def collect_published(
    matches: list[str], gone: list[str], group: int, samples: list[str], first_part: int,
    out_old: str | os.PathLike, out_exclusions: str | os.PathLike, out_gone: str | os.PathLike,
    exact: bool = True, near: bool = True,
) -> dict:  # fmt: skip
    """A group's rows from every bucket: `old` (part, row, version of samples whose source_id was published
    and that no other step left out; for the near-duplicate search) and, with `exact` (publish.dedupe), the
    exclusions of its new samples whose url, else sha256, was published; and the published records gone
    from the build that its share of the manifests holds, in published order (for split_near_entries)."""
    m = read_bucket(matches, group, MATCHES).to_pandas()
    m = m.sort_values(["id", "kind"], kind="stable")
    published_ids = m.loc[m["kind"] == SOURCE_ID, "id"].unique()
    old = m[(m["kind"] == SOURCE_ID) & m["kept"] & near]
    ids = old["id"].to_numpy(np.int64)
    old = pd.DataFrame({"part": part_of(ids), "row": row_of(ids), "version": old["version"]})
    hits = m[(m["kind"] != SOURCE_ID) & ~m["id"].isin(published_ids) & exact].drop_duplicates("id")  # url first
    keys = {}
    for part in sorted(set(part_of(hits["id"].to_numpy(np.int64)).tolist())):
        keys[part] = pd.read_parquet(samples[part - first_part], columns=["key"])["key"].astype(str).to_numpy(object)
    rows = [
        [keys[part_of(i)][row_of(i)], STAGE, REASON, f"{WHAT[kind]} already published as {key} in version {version}"]
        for i, kind, key, version in zip(
            hits["id"].tolist(), hits["kind"].tolist(), hits["key"].tolist(), hits["version"].tolist(), strict=True
        )
    ]
    gone_rows = read_gone_table(read_bucket(gone, group, GONE))
    excluded = pd.DataFrame(rows, columns=EXCLUSION_COLUMNS)
    for frame, path in ((old[OLD], out_old), (excluded, out_exclusions), (gone_rows, out_gone)):
        with atomic_open(path) as f:
            frame.reset_index(drop=True).to_parquet(f, index=False)
    return {"kept_from_earlier_versions": len(published_ids), "excluded": len(rows), "gone": len(gone_rows)}


def read_gone_table(table: pa.Table) -> pd.DataFrame:
    """Published records gone from the build (GONE_COLUMNS) in published order (oldest version, then
    manifest order)."""
    return table.to_pandas().sort_values("order", kind="stable")[GONE_COLUMNS].reset_index(drop=True)


def read_gone(paths: list[str]) -> pd.DataFrame:
    """The groups' gone tables as one, in published order."""
    frames = [pq.read_table(p).cast(GONE) for p in paths]
    return read_gone_table(pa.concat_tables(frames) if frames else GONE.empty_table())
