"""Near-duplicate images within the version being built and against the published versions.

Two signals: the perceptual hash of every published image (shardsmith.download.process.phash, computed where the
image is decoded: resized, recompressed, slightly cropped and mirrored copies) and, with embed.enabled and a
threshold set, the cosine similarity of the CLIP image embeddings (the same content reshot or re-edited). Pairs are
found by jobs that each see a part of the dataset (shardsmith.shards.nearparts: a map per group of parts, a job
per bucket), then decided by jobs that each settle the samples of one partition (shardsmith.shards.neardecide).
Each copy set (the copies of one image) keeps one sample by a fixed rule, so a rebuild keeps the same one:

1. a sample already published (its source_id is in a published version) is always kept;
2. with `keep: best_caption` (embed.enabled), the caption that matches its image best (the CLIP image-caption
   similarity embed_part scored, in steps of nearparts.CAPTION_STEP);
3. then the largest image (pixels before resizing);
4. then, at equal pixels, the largest file as fetched (the copy compressed least; with best_caption, the most
   bytes a pixel, the same order);
5. then the earliest record (part order, record order within the part).

Samples are visited in that order; each one not yet taken keeps its near neighbours that are not taken yet,
so every sample left out is within the threshold of the sample it names (no chains). With `near: exclude`
those land in the ledger (stage dedupe, reason near_duplicate); with `report` they are only reported.
"""

from __future__ import annotations

import json
import math
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from shardsmith.core.atomic import atomic_write_text
from shardsmith.core.errors import ConfigError
from shardsmith.core.ledger import REFERENCE_VERSION
from shardsmith.shards.neardecide import HOME_SCHEMA, finish, write_by_home, write_pairs
from shardsmith.shards.nearparts import (
    CELL_TRAIN_PER_CENTROID,
    EMBEDDING_PROBES,
    REFERENCE_PRIORITY,
    Cells,
    Layout,
    bucket_count,
    bucket_pairs,
    cell_count,
    merge_entries,
    part_entries,
    priority,
    read_cells,
    train_cells,
    write_cells,
    write_entries,
)
from shardsmith.shards.sampleid import ORDER_BITS, gone_ids, sample_ids

MODES = ("report", "exclude", "off")
KEEP_RULES = ("largest_source", "best_caption")


@dataclass(frozen=True)
class NearSettings:
    """The config's `dedupe` section."""

    near: str = "report"  # report | exclude | off
    phash_max_distance: int = 8  # Hamming distance (of 64 bits) at or under which two images are near
    embedding_min_similarity: float | None = None  # cosine similarity at or over which two images are near
    bin_size: int = 20_000  # a cell searched exactly up to this many (shardsmith.shards.nearsearch)
    cell_samples: int = 500_000  # samples a cell holds (nearparts): more cells, smaller searches
    cell_probes: int | None = None  # cells each hash goes to; None: as many as the cell count needs for recall
    bucket_samples: int = 500_000  # samples' entries a bucket job reads: sets the jobs' size
    buckets: int | None = None  # bucket jobs; None: from the dataset's size and bucket_samples
    decision_rounds: int = 3  # rounds of the partitions' decision before one job settles what still waits
    buckets_per_job: int | str = "auto"  # buckets (and decision partitions) a planning job takes, in turn
    groups_per_job: int | str = "auto"  # groups of parts a planning job takes, one after another
    keep: str = KEEP_RULES[0]  # which copy a copy set keeps: largest_source, or best_caption first

    def __post_init__(self) -> None:
        if self.near not in MODES:
            raise ConfigError(f"dedupe.near must be one of {', '.join(MODES)}, got {self.near!r}")
        if self.keep not in KEEP_RULES:
            raise ConfigError(f"dedupe.keep must be one of {', '.join(KEEP_RULES)}, got {self.keep!r}")
        if not 0 <= self.phash_max_distance <= 32:
            raise ConfigError(f"dedupe.phash_max_distance must be in 0..32, got {self.phash_max_distance}")
        s = self.embedding_min_similarity
        if s is not None and not 0 < s <= 1:
            raise ConfigError(f"dedupe.embedding_min_similarity must be in (0, 1] or null, got {s}")
        if self.bin_size < 100:
            raise ConfigError(f"dedupe.bin_size must be >= 100, got {self.bin_size}")
        if self.buckets is not None and self.buckets < 1:
            raise ConfigError(f"dedupe.buckets must be >= 1 or null, got {self.buckets}")
        if self.cell_probes is not None and self.cell_probes < 1:
            raise ConfigError(f"dedupe.cell_probes must be >= 1 or null, got {self.cell_probes}")
        if self.decision_rounds < 1:
            raise ConfigError(f"dedupe.decision_rounds must be >= 1, got {self.decision_rounds}")
        for key in ("buckets_per_job", "groups_per_job"):
            value = getattr(self, key)
            if value != "auto" and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ConfigError(f"dedupe.{key} must be a positive number or auto, got {value!r}")

    def recorded(self) -> dict:
        """The settings as near_duplicates.json records them: `keep` named where it is not the default."""
        settings = vars(self).copy()
        if settings["keep"] == KEEP_RULES[0]:
            del settings["keep"]
        return settings

    def layout(self, samples: int) -> Layout:
        """Cells and bucket jobs for a dataset of this many samples."""
        cells, probes = cell_count(samples, self.cell_samples, self.cell_probes)
        return Layout(cells=cells, buckets=bucket_count(samples, self.bucket_samples, self.buckets, probes),
                      probes=probes)  # fmt: skip

    def rounds_for(self, layout: Layout) -> int:
        """Decision rounds (shardsmith.shards.neardecide): one settles everything when one partition holds it."""
        return 1 if layout.buckets == 1 else self.decision_rounds


def check_keep_rule(config: dict) -> None:
    """dedupe.keep: best_caption reads each copy's CLIP similarity, so it needs the embedding stage."""
    if config["dedupe"].get("keep") == "best_caption" and not config["embed"]["enabled"]:
        raise ConfigError(
            "dedupe.keep: best_caption compares the CLIP similarity of each copy's caption; set embed.enabled, "
            "or keep: largest_source"
        )


def _codes(hexes: pd.Series) -> np.ndarray:
    """16-hex-digit hashes as uint64, without a Python int per hash."""
    return np.frombuffer(bytes.fromhex("".join(hexes.to_numpy(dtype=str))), dtype=">u8").astype(np.uint64)


_NO_OLD = pd.DataFrame({"part": [], "row": [], "version": []})  # no samples already published
GONE_COLUMNS = ["key", "version", "width_before", "height_before", "phash", "phash_mirror", "order"]
FIRST_REFERENCE_VERSION = 1 << 20  # the version index of the first reference set: after any a dataset can have
# Cells a reference image's hashes go to, as a multiple of a sample's probes: a copy of it is missed only where
# the two fall in no common cell, and references are few (10,000 of them add 0.01% to a LAION-400M search).
REFERENCE_PROBES = 4


def part_candidates(
    samples_path: str, part: int, dropped_rows: np.ndarray, old_rows: np.ndarray,
    captions: tuple[str, str] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """(ids, priorities, hashes, mirror hashes, rows) of a part's samples that no other step left out (its
    rows `dropped_rows`); `captions`: the part's CLIP score table and its similarity column, first in the keep
    order (best_caption)."""
    present = set(pq.read_schema(samples_path).names)
    cols = ["width_before", "height_before", "phash", "phash_mirror"]
    t = pd.read_parquet(samples_path, columns=cols + [c for c in ("bytes_before", "bytes") if c in present])
    keep = np.ones(len(t), bool)
    keep[np.asarray(dropped_rows, np.int64)] = False
    rows = np.flatnonzero(keep)
    t = t.iloc[rows]
    area = t["width_before"].to_numpy(np.int64) * t["height_before"].to_numpy(np.int64)
    # the file as fetched: parts processed before its column was recorded have the published file's size
    size = next((c for c in ("bytes_before", "bytes") if c in t), None)
    nbytes = t[size].fillna(0).to_numpy(np.int64) if size else np.zeros(len(t), np.int64)
    caption = _part_similarity(*captions, samples_path)[rows] if captions else None
    prio = priority(np.isin(rows, old_rows), area, nbytes, caption)
    return sample_ids(part, rows), prio, _codes(t["phash"]), _codes(t["phash_mirror"]), rows


def gone_candidates(
    gone: pd.DataFrame, part: int, captions: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Published records gone from the build, and reference images, as keepers: a reference comes before any
    other (its near copies are named near_reference, whatever else they are near). `captions`: the keep rule
    compares captions (best_caption), which gone records have no score of."""
    area = gone["width_before"].to_numpy(np.int64) * gone["height_before"].to_numpy(np.int64)
    reference = gone["version"].astype(str).str.startswith(REFERENCE_VERSION).to_numpy()
    caption = np.full(len(gone), np.nan) if captions else None
    prio = priority(np.ones(len(gone), bool), area, np.zeros(len(gone), np.int64), caption)
    prio = np.where(reference, REFERENCE_PRIORITY, prio)
    return gone_ids(gone["order"].to_numpy(np.int64), part), prio, _codes(gone["phash"]), _codes(gone["phash_mirror"])


def reference_candidates(references: pd.DataFrame) -> pd.DataFrame:
    """Reference images (shardsmith.download.references' table) as published records gone from the build
    (GONE_COLUMNS): their `order` after every published version's (FIRST_REFERENCE_VERSION on), in set and file
    order, so that every job gives a reference the same id."""
    version = np.int64(FIRST_REFERENCE_VERSION) + references["set"].to_numpy(np.int64)
    order = (version << np.int64(ORDER_BITS)) | references["row"].to_numpy(np.int64)
    return references.assign(order=order)[GONE_COLUMNS]


def train_part_cells(
    sample_paths: list[str], layout: Layout, s: NearSettings, embedding_paths: list[str] = ()
) -> tuple[Cells, Cells | None]:
    """Cells from an evenly strided sample of the hashes (and embeddings, when used) of evenly strided parts:
    enough parts for four times the training points, not every part (LAION-5B has tens of thousands).
    Embeddings go to EMBEDDING_PROBES cells, not the hashes' probes: as many fewer cells, of the same size."""
    if layout.cells <= 1:
        return Cells.flat(np.zeros((0, 64), np.float32)), None
    embedding_cells = max(1, math.ceil(layout.cells * min(EMBEDDING_PROBES, layout.probes) / layout.probes))
    every = max(1, layout.cells // embedding_cells)  # the embeddings' sample: every so many hashes' rows
    want = layout.cells * CELL_TRAIN_PER_CENTROID
    rows = [pq.ParquetFile(p).metadata.num_rows for p in sample_paths]
    per_part = max(1, sum(rows) // max(1, len(rows)))
    chosen = list(range(0, len(sample_paths), max(1, len(sample_paths) * per_part // (4 * want))))
    total = sum(rows[p] for p in chosen)
    step = max(1, total // want)
    codes, vecs, seen = [], [], 0
    for p in chosen:
        path = sample_paths[p]
        t = pd.read_parquet(path, columns=["phash"])
        take = np.arange((-seen) % step, len(t), step)
        codes.append(_codes(t["phash"].iloc[take]))
        if s.embedding_min_similarity is not None and embedding_paths:
            with np.load(embedding_paths[p], allow_pickle=False) as z:
                vecs.append(z["image"][take[::every]])
        seen += len(t)
    phash = train_cells(np.concatenate(codes), layout.cells, True, layout.probes)
    embedding = train_cells(np.concatenate(vecs), embedding_cells, False, EMBEDDING_PROBES) if vecs else None
    return phash, embedding


# The workflow's jobs (rules/shards.smk), in their order: the published lookups (shardsmith.shards.published),
# then train_near_cells, split_near_entries per group, find_near_pairs per bucket, decide_near_round per round and
# partition, decide_near_duplicates.


def train_near_cells(
    sample_paths: list[str], s: NearSettings, samples: int, embedding_paths: list[str], out_cells: str,
    layout: Layout | None = None,
) -> Layout:  # fmt: skip
    """The cells' centroids for a dataset of about `samples` samples (or as `layout` says), trained on a
    strided sample of the build's hashes."""
    layout = layout or s.layout(samples)
    cells = train_part_cells(sample_paths, layout, s, embedding_paths)
    write_cells(out_cells, layout, cells[0], cells[1])
    return layout


def _write_home_rows(path: str, ids: np.ndarray, homes: np.ndarray, fields: pd.DataFrame, layout: Layout) -> None:
    home = pd.Series(homes, index=ids)
    fields = fields.assign(home=home.reindex(fields["id"].to_numpy()).fillna(0).to_numpy(np.int32))
    write_by_home(path, fields, "home", HOME_SCHEMA, layout.buckets)


SPLIT_CHUNK = 50_000  # samples whose entries are made and sorted at once (4 + probes of them a hash, twice)


def split_near_entries(
    samples: list[str], first_part: int, dropped: list[np.ndarray], old_path: str | None, cells_path: str, out: str,
    out_homes: str, embeddings: list[str], gone: pd.DataFrame | None = None, parts: int = 0,
    scores: list[str] = (), similarity: str = "", reference_embeddings: np.ndarray | None = None,
) -> int:  # fmt: skip
    """The near-duplicate entries of a group's parts, of their samples that the steps before kept (`dropped`: each
    part's rows left out), in one file, one batch per bucket, and their home rows (key, version, ledger fields),
    one batch per partition; returns the samples compared. `gone`: published records no longer in the build
    (its share of them, GONE_COLUMNS), entered too, as keepers only, after every one of the `parts` parts.
    `scores` (keep: best_caption): the parts' CLIP score tables, their column `similarity` first in the keep
    order. `reference_embeddings`: the CLIP image embeddings of `gone`'s reference images, in their order, entered
    into the embedding cells too (REFERENCE_PROBES times a sample's). Entries
    are made SPLIT_CHUNK samples at a time into chunk files beside `out` (a `.spill-*` folder, removed after) and
    merged a bucket at a time: the job's memory follows the chunk, not the group, at any probes."""
    layout, phash, embedding = read_cells(cells_path)
    chunk_files, ids_seen, homes_seen, homes, n = [], [], [], [], 0
    with tempfile.TemporaryDirectory(prefix=".spill-", dir=Path(out).parent) as tmp:
        for i, path in enumerate(samples):
            part = first_part + i
            old = pd.read_parquet(old_path, filters=[("part", "=", part)]) if old_path else _NO_OLD
            old_rows = old["row"].to_numpy() if len(old) else np.empty(0, np.int64)
            captions = (scores[i], similarity) if scores else None
            ids, prio, code, mirror, rows = part_candidates(path, part, dropped[i], old_rows, captions)
            emb = _part_embeddings(embeddings[i], path, rows) if embeddings else None
            for at in range(0, len(ids), SPLIT_CHUNK):
                take = slice(at, at + SPLIT_CHUNK)
                table = part_entries(ids[take], prio[take], code[take], mirror[take], layout, phash,
                                     emb[take] if emb is not None else None, embedding)  # fmt: skip
                chunk_files.append(str(Path(tmp) / f"{len(chunk_files)}.arrow"))
                write_entries(chunk_files[-1], table, layout)
                first_ids, first = np.unique(table["id"].to_numpy(), return_index=True)
                ids_seen.append(first_ids)
                homes_seen.append(table["home"].to_numpy()[first])
            homes.append(_home_fields(path, ids, rows, old))
            n += len(ids)
        if gone is not None and len(gone):
            ids, prio, code, mirror = gone_candidates(gone, parts, bool(scores))
            reference = gone["version"].astype(str).str.startswith(REFERENCE_VERSION).to_numpy()
            wide = replace(layout, probes=min(layout.cells, layout.probes * REFERENCE_PROBES))
            emb = None
            if reference_embeddings is not None:
                emb = np.zeros((len(gone), reference_embeddings.shape[1]), np.float16)
                emb[reference] = reference_embeddings
            for at in range(0, len(ids), SPLIT_CHUNK):
                take = slice(at, at + SPLIT_CHUNK)
                tables = []
                for m, lay in ((~reference[take], layout), (reference[take], wide)):
                    if not m.any():
                        continue
                    with_emb = emb is not None and lay is wide
                    tables.append(part_entries(ids[take][m], prio[take][m], code[take][m], mirror[take][m], lay, phash,
                                               emb[take][m] if with_emb else None, embedding if with_emb else None,
                                               EMBEDDING_PROBES * REFERENCE_PROBES))  # fmt: skip
                table = pa.concat_tables(tables)
                chunk_files.append(str(Path(tmp) / f"{len(chunk_files)}.arrow"))
                write_entries(chunk_files[-1], table, layout)
                first_ids, first = np.unique(table["id"].to_numpy(), return_index=True)
                ids_seen.append(first_ids)
                homes_seen.append(table["home"].to_numpy()[first])
            blank = np.full(len(gone), "", object)
            homes.append(pd.DataFrame({"id": ids, "key": gone["key"].astype(str).to_numpy(),
                                       "version": gone["version"].astype(str).to_numpy(), "source": blank,
                                       "source_id": blank, "url": blank}))  # fmt: skip
        merge_entries(out, chunk_files, layout, n)  # the build's samples compared: published ones are not counted
    fields = pd.concat(homes, ignore_index=True) if homes else _no_homes()
    ids_all = np.concatenate(ids_seen) if ids_seen else np.empty(0, np.int64)
    homes_all = np.concatenate(homes_seen) if homes_seen else np.empty(0, np.int32)
    _write_home_rows(out_homes, ids_all, homes_all, fields, layout)
    return n


def find_near_pairs(
    entries: list[str], bucket: int, s: NearSettings, incoming: str, outgoing: str, partitions: int
) -> int:
    """A bucket's near pairs from every group's entries, written for the partitions that decide them
    (neardecide.write_pairs); returns how many."""
    pairs = bucket_pairs(entries, bucket, s.phash_max_distance, s.embedding_min_similarity, s.bin_size)
    write_pairs(incoming, outgoing, pairs, partitions)
    return len(pairs)


def _home_fields(samples_path: str, ids: np.ndarray, rows: np.ndarray, old: pd.DataFrame) -> pd.DataFrame:
    present = set(pq.read_schema(samples_path).names)
    t = pd.read_parquet(samples_path, columns=[c for c in ("key", "source", "source_id", "url") if c in present])
    t = t.iloc[rows]
    version = pd.Series(old["version"].to_numpy(), index=old["row"].to_numpy()) if len(old) else pd.Series(dtype=str)
    return pd.DataFrame({"id": ids, "key": t["key"].astype(str).to_numpy(),
                         "version": version.reindex(rows).fillna("").astype(str).to_numpy(),
                         **{c: (t[c].fillna("").astype(str).to_numpy() if c in t else np.full(len(t), "", object))
                            for c in ("source", "source_id", "url")}})  # fmt: skip


def _no_homes() -> pd.DataFrame:
    return HOME_SCHEMA.empty_table().to_pandas()


def _part_embeddings(embeddings_path: str, samples_path: str, rows: np.ndarray) -> np.ndarray:
    with np.load(embeddings_path, allow_pickle=False) as z:
        keys, image = z["key"], z["image"]
    if not np.array_equal(keys, pd.read_parquet(samples_path, columns=["key"])["key"].to_numpy(dtype=str)):
        raise ValueError(f"{embeddings_path} does not hold the rows of {samples_path}: run embed_part for it again")
    return image[rows]


def _part_similarity(scores_path: str, column: str, samples_path: str) -> np.ndarray:
    t = pd.read_parquet(scores_path, columns=["key", column])
    if not np.array_equal(
        t["key"].to_numpy(dtype=str), pd.read_parquet(samples_path, columns=["key"])["key"].to_numpy(dtype=str)
    ):
        raise ValueError(f"{scores_path} does not hold the rows of {samples_path}: run embed_part for it again")
    return t[column].to_numpy(np.float64)


def decide_near_duplicates(
    found: list[str], pending: list[str], last_messages: list[str], part_ids: list[str], s: NearSettings,
    compared: int, out_dir: str | Path, references: bool = False,
) -> dict:  # fmt: skip
    """near_duplicates.parquet and .json, and near_dropped.parquet (the ledger piece of the samples left out: no
    rows unless exclude), from the partitions' last round (shardsmith.shards.neardecide); returns the counts."""
    out_dir = Path(out_dir)
    counts = finish(found, pending, last_messages, list(part_ids), s.near == "exclude",
                    out_dir / "near_duplicates.parquet", out_dir / "near_dropped.parquet", out_dir,
                    references)  # fmt: skip
    counts = {"samples_compared": compared, **counts}
    atomic_write_text(
        out_dir / "near_duplicates.json", json.dumps({**counts, "settings": s.recorded()}, indent=1) + "\n"
    )
    return counts
