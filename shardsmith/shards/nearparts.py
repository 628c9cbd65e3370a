"""The near-duplicate search as partitioned jobs: a map per group, a job per bucket, one small decision.

Map (`neardup.split_near_entries`, per group): every candidate sample (one no other stage left out) becomes
entries, each with the sample's id (shardsmith.shards.sampleid: dataset order) and its keep priority (`priority`):
- block entries: its hash and its mirror's, once for each of its four blocks (`hash_blocks`: a 16-bit
  block's position and value). Two hashes at most 3 bits apart agree on one block whole (3 differing bits
  leave one of four untouched), so they meet in one block whatever else happens;
- cell entries: its hash and its mirror's in the `Layout.probes` cells nearest to it, cells being k-means
  centroids trained once on a sample of the dataset (`train_cells`); hashes a few bits apart mostly share
  a cell, and each cell is searched alone (nearsearch.held_pairs: exact up to `bin_size`, above it by
  sampled-bit tables, whose recall of a pair follows from its distance alone).
  The finer the cells, the more often a pair's two hashes fall nearest to different ones, so the probes
  grow with the cell count (`cell_probes`): recall stays level at any size, the cost per sample grows
  with the probes. With CLIP embeddings as a signal, their own cells the same way (`EMBEDDING_PROBES`).
A bucket job (`bucket_pairs`) takes some blocks (by hash) and some cells (cell mod buckets) from every
part's entries and writes the near pairs among them. Which bucket holds a block or a cell changes nothing
found: the bucket count sets the jobs' size, not the result. The cell count does (it follows the dataset's
size, `cell_count`); with one cell the search is the single search of the whole dataset.

The entries' layout and the bucket search read the same schema and cells, so this module is over 400
lines.
"""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass

import faiss
import numpy as np
import pandas as pd
import pyarrow as pa

from shardsmith.core.atomic import atomic_open
from shardsmith.formats import shuffle
from shardsmith.formats.shuffle import read_meta, write_buckets, write_cut
from shardsmith.formats.tables import key_hashes
from shardsmith.shards.nearsearch import MIRROR, SEED, best_pairs, held_pairs, same_key_pairs

EMBEDDING_PROBES = 2  # cells an embedding goes to: near copies' embeddings sit far closer than 8-bit hash pairs
# Probes a hash needs with this many cells for two hashes 4-8 bits apart (as many of each distance) to share
# a cell 98% of the time, measured on uniformly random hashes, where k-means cells have no structure to
# follow (bench/results/near-probes.json; real hashes cluster, and need no more). Between the points, the
# log of the cell count is interpolated; past the last, each fourfold of cells adds as many as the last did.
# fmt: off
PROBE_TABLE = ((1, 1), (2, 2), (4, 2), (10, 3), (40, 4), (160, 6), (640, 8), (2560, 10),
               (5120, 14), (10240, 15), (40960, 20))  # above FLAT_CELLS: two-level cells
# fmt: on
CELL_TRAIN_PER_CENTROID = 64
BLOCK, PHASH_CELL, EMBEDDING_CELL = 0, 1, 2  # entry kinds
SIGNALS = {PHASH_CELL: "phash", EMBEDDING_CELL: "embedding"}
SAME_HASH = "same_hash"  # a pair of a sample and the first sample (in keep order) with its very hash
PUBLISHED_BIT = np.uint64(1 << 63)  # set in the priority of a sample NOT published: published ones sort first
_AREA_BITS, _BYTES_BITS = 35, 28
_CAPTION_BITS, _PER_PIXEL_BITS = 8, 20  # with caption: 1 + 8 + 35 + 20 bits
# Caption similarities are compared in steps this wide: what resizing, recompressing or mirroring the same image
# moves a similarity by stays mostly within a step, a caption that says more of the image is a step or more
# above one that says less (LAION-2B-en's whole cut is 0.28 against a mean near 0.32 with ViT-B/32).
CAPTION_STEP = 0.02
# A reference image's priority (shardsmith.shards.neardup.gone_candidates): before every sample's, whatever the
# keep rule; the bucket jobs know the references by it. No sample's is 0 (it would be published with 2^35
# pixels and 256 MiB, or a perfect caption, 2^35 pixels and 16 bytes a pixel).
REFERENCE_PRIORITY = np.uint64(0)

# block_or_cell: what an entry is compared within, its block (BLOCK entries) or its cell (cell entries)
ENTRY_SCHEMA = pa.schema(
    [("bucket", pa.int32()), ("block_or_cell", pa.int64()), ("kind", pa.int8()), ("id", pa.int64()),
     ("prio", pa.uint64()), ("mirror", pa.bool_()), ("code", pa.uint64()), ("vec", pa.binary()),
     ("home", pa.int32())]
)  # fmt: skip


def priority(
    published: np.ndarray, area: np.ndarray, nbytes: np.ndarray, caption: np.ndarray | None = None
) -> np.ndarray:
    """The keep order as one number, smallest first (ties by id, the earliest record): a sample already
    published, then the largest image (pixels before resizing), then the largest file (at equal pixels, the
    copy compressed least). Areas over 2^35 pixels and files over 256 MiB count as those.

    With `caption` (dedupe.keep: best_caption; each sample's CLIP image-caption similarity, NaN where there is
    none): after published, the caption that matches its image best, in steps of CAPTION_STEP, then the
    largest image, then the most bytes a pixel (the same order as bytes at equal pixels, in 20 bits: 1/65,536
    of a byte up to 16 bytes a pixel)."""
    area = np.minimum(np.asarray(area, np.int64), (1 << _AREA_BITS) - 1).astype(np.uint64)
    inv_area = np.uint64((1 << _AREA_BITS) - 1) - area
    if caption is None:
        nbytes = np.minimum(np.asarray(nbytes, np.int64), (1 << _BYTES_BITS) - 1).astype(np.uint64)
        inv_bytes = np.uint64((1 << _BYTES_BITS) - 1) - nbytes
        prio = (inv_area << np.uint64(_BYTES_BITS)) | inv_bytes
    else:
        inv_caption = np.uint64((1 << _CAPTION_BITS) - 1) - caption_level(caption)
        per_pixel = np.asarray(nbytes, np.float64) * (1 << 16) / np.maximum(area.astype(np.float64), 1.0)
        per_pixel = np.minimum(np.nan_to_num(per_pixel), (1 << _PER_PIXEL_BITS) - 1).astype(np.uint64)
        inv_per_pixel = np.uint64((1 << _PER_PIXEL_BITS) - 1) - per_pixel
        prio = (inv_caption << np.uint64(_AREA_BITS + _PER_PIXEL_BITS)) | (inv_area << np.uint64(_PER_PIXEL_BITS))
        prio |= inv_per_pixel
    return np.where(np.asarray(published, bool), prio, prio | PUBLISHED_BIT)


def caption_level(similarity: np.ndarray) -> np.ndarray:
    """A CLIP similarity in [-1, 1] as a step of CAPTION_STEP, 1 (at -1) to 101 (at 1); NaN (no score) 0."""
    s = np.clip(np.asarray(similarity, np.float64), -1.0, 1.0)
    missing = np.isnan(s)
    level = np.floor((np.where(missing, -1.0, s) + 1.0) / CAPTION_STEP + 1e-9).astype(np.int64) + 1
    return np.where(missing, 0, level).astype(np.uint64)


def is_published(prio: np.ndarray) -> np.ndarray:
    return (np.asarray(prio, np.uint64) & PUBLISHED_BIT) == 0


def cell_probes(cells: int) -> int:
    """The cells each hash goes to with this many cells (PROBE_TABLE)."""
    if cells <= 1:
        return 1
    x = math.log2(cells)
    points = [(math.log2(c), p) for c, p in PROBE_TABLE]
    (x0, p0), (x1, p1) = next(((a, b) for a, b in zip(points, points[1:], strict=False) if x <= b[0]), points[-2:])
    return min(cells, math.ceil(p0 + (p1 - p0) * (x - x0) / (x1 - x0) - 1e-9))


@dataclass(frozen=True)
class Layout:
    """How the search is cut: `cells` per signal and the `probes` (cells each hash goes to), which decide what
    is compared and follow the dataset's size, and `buckets`, the jobs that share the blocks and cells out
    (free: the same pairs for any count). probes 0: cell_probes(cells)."""

    cells: int
    buckets: int
    probes: int = 0

    def __post_init__(self) -> None:
        if self.probes <= 0:
            object.__setattr__(self, "probes", cell_probes(self.cells))


def cell_count(samples: int, cell_samples: int, probes: int | None = None) -> tuple[int, int]:
    """(cells, probes): cells of about `cell_samples` samples each, every sample (hash and mirror) in `probes`
    of them; probes None: as many as cell_probes asks for that many cells (more probes, more cells)."""
    if samples <= cell_samples:  # one cell holds them all: the single search of the dataset
        return 1, 1
    p = probes or 2
    while True:
        cells = max(1, math.ceil(samples * p / cell_samples))
        want = probes or cell_probes(cells)
        if want <= p or probes:
            return cells, min(want, cells) if cells > 1 else 1
        p = want


def bucket_count(samples: int, bucket_samples: int, override: int | None = None, probes: int = 2) -> int:
    """Bucket jobs of `bucket_samples` samples' entries at two probes: a sample has 4 block entries and one a
    probe (twice: hash and mirror), so more probes make more buckets, each reading as many entries."""
    return override if override else max(1, math.ceil(samples * (4 + probes) / (6 * bucket_samples)))


def signs(codes: np.ndarray) -> np.ndarray:
    bits = np.unpackbits(np.asarray(codes, np.uint64).astype(">u8").view(np.uint8).reshape(-1, 8), axis=1)
    return bits.astype(np.float32) * 2 - 1


FLAT_CELLS = 4096  # above this many cells, they are trained and found in two levels (Cells)
_CHUNK_ROWS = 65_536  # vectors expanded to floats at a time


@dataclass(frozen=True)
class Cells:
    """Cell centroids. Above FLAT_CELLS, in two levels: `coarse` centroids, each holding the cells nearest to
    it, so that a vector's nearest cells are looked for under its nearest coarse centroids (faiss's IVF
    search), not among every cell. Flat: no coarse rows."""

    centroids: np.ndarray
    coarse: np.ndarray

    def __len__(self) -> int:
        return len(self.centroids)

    @functools.cached_property
    def index(self) -> tuple[faiss.Index, faiss.Index]:
        """The search index, built once for all the chunks a job looks up (placing 300,000 cells under their
        coarse centroids is itself a search), with the quantizer it needs alive (the IVF index does not own it)."""
        quantizer = faiss.IndexFlatL2(self.centroids.shape[1])
        if not len(self.coarse):
            quantizer.add(np.ascontiguousarray(self.centroids, np.float32))
            return quantizer, quantizer
        quantizer.add(np.ascontiguousarray(self.coarse, np.float32))
        index = faiss.IndexIVFFlat(quantizer, self.centroids.shape[1], len(self.coarse))
        index.add(np.ascontiguousarray(self.centroids, np.float32))  # each cell in its nearest coarse one's list
        return index, quantizer

    @classmethod
    def flat(cls, centroids: np.ndarray) -> Cells:
        return cls(np.asarray(centroids, np.float32), np.zeros((0, np.shape(centroids)[1]), np.float32))


def _floats(x: np.ndarray, binary: bool) -> np.ndarray:
    return signs(x) if binary else np.ascontiguousarray(x, np.float32)


def _kmeans(x: np.ndarray, k: int) -> np.ndarray:
    if k == 1:
        return x.mean(axis=0, keepdims=True)
    km = faiss.Kmeans(x.shape[1], k, niter=12, seed=SEED, max_points_per_centroid=CELL_TRAIN_PER_CENTROID * 4)
    km.train(np.ascontiguousarray(x))
    return km.centroids


def train_cells(sample: np.ndarray, cells: int, binary: bool, probes: int = 2) -> Cells:
    """k-means centroids (fixed seed) for `cells` cells from a sample of hashes (binary: uint64 codes, expanded
    to floats a chunk at a time) or embeddings; above FLAT_CELLS in two levels: sqrt(2 x probes x cells)
    coarse centroids (the count that makes the fewest distances for a vector's `probes` nearest cells: the
    coarse ones, and the cells under 2 x probes of them), then each coarse centroid's share of the cells (by
    its share of the sample) trained on its points. The training's time grows with cells^1.5, not cells^2."""
    dim = 64 if binary else (sample.shape[1] if sample.ndim == 2 else 64)
    cells = min(cells, len(sample))
    if cells <= 1:
        return Cells.flat(np.zeros((0, dim), np.float32))
    if cells <= FLAT_CELLS:
        return Cells.flat(_kmeans(_floats(sample, binary), cells))
    k1 = max(2, min(cells // 4, math.isqrt(2 * probes * cells)))
    step = max(1, len(sample) // (k1 * CELL_TRAIN_PER_CENTROID * 4))
    coarse = _kmeans(_floats(sample[::step], binary), k1)
    owner = np.concatenate([_nearest(_floats(sample[at : at + _CHUNK_ROWS], binary), Cells.flat(coarse), 1)[:, 0]
                            for at in range(0, len(sample), _CHUNK_ROWS)])  # fmt: skip
    order = np.argsort(owner, kind="stable")
    counts = np.bincount(owner, minlength=k1)
    share = np.cumsum(counts) * cells // len(sample)  # each coarse centroid's cells, by its points
    fine = np.minimum(np.diff(np.r_[0, share]), counts)
    centroids, at = [], 0
    for j in range(k1):
        rows = order[at : at + counts[j]]
        at += counts[j]
        if fine[j]:
            centroids.append(_kmeans(_floats(sample[rows], binary), int(fine[j])))
    return Cells(np.concatenate(centroids).astype(np.float32), coarse.astype(np.float32))


def _nearest(x: np.ndarray, cells: Cells, k: int) -> np.ndarray:
    index, _ = cells.index
    x = np.ascontiguousarray(x, np.float32)
    if not len(cells.coarse):
        return index.search(x, min(k, len(cells)))[1].astype(np.int64)
    index.nprobe = min(len(cells.coarse), 2 * k)
    found = index.search(x, min(k, len(cells)))[1].astype(np.int64)
    return np.where(found < 0, found[:, :1], found)  # fewer cells under the coarse lists searched than asked: rare


def nearest_cells(x: np.ndarray, cells: Cells | None, probes: int) -> np.ndarray:
    """(n, probes) cells of each vector, nearest first (all 0 with one cell). In two levels: the nearest among
    the cells under its 2 x probes nearest coarse centroids."""
    if cells is None or len(cells) <= 1:
        return np.zeros((len(x), 1), np.int64)
    return _nearest(x, cells, probes)


def hash_blocks(codes: np.ndarray) -> np.ndarray:
    """(n, 4) blocks of each hash, its 16-bit block j as j << 16 | the block's value: two hashes share a block
    when they agree on the same 16 bits."""
    j = np.arange(4, dtype=np.uint64)
    values = (np.asarray(codes, np.uint64)[:, None] >> (np.uint64(16) * j)) & np.uint64(0xFFFF)
    return (j.astype(np.int64) << np.int64(16)) | values.astype(np.int64)


def block_bucket(blocks: np.ndarray, buckets: int) -> np.ndarray:
    if buckets == 1:
        return np.zeros(len(blocks), np.int32)
    return (key_hashes(pd.Series(blocks.astype(str))) % np.uint64(buckets)).astype(np.int32)


def home_partitions(ids: np.ndarray, nearest: np.ndarray | None, partitions: int) -> np.ndarray:
    """The partition that decides each sample (shardsmith.shards.neardecide): its nearest cell's, so that the
    two samples of most near pairs share it; with one cell, a hash of its id."""
    ids = np.asarray(ids, np.int64)
    if partitions <= 1:
        return np.zeros(len(ids), np.int32)
    if nearest is None:
        x = ids.view(np.uint64) + np.uint64(0x9E3779B97F4A7C15)  # splitmix64's finaliser: ids spread evenly
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return ((x ^ (x >> np.uint64(31))) % np.uint64(partitions)).astype(np.int32)
    return (np.asarray(nearest, np.int64) % partitions).astype(np.int32)


def _entries(kind: int, block_or_cell: np.ndarray, bucket: np.ndarray, ids, prio, mirror, code, vec, home) -> pa.Table:
    n = len(block_or_cell)
    return pa.table(
        {
            "bucket": pa.array(bucket, pa.int32()), "block_or_cell": pa.array(block_or_cell, pa.int64()),
            "kind": pa.array(np.full(n, kind, np.int8)), "id": pa.array(ids, pa.int64()),
            "prio": pa.array(prio, pa.uint64()), "mirror": pa.array(mirror, pa.bool_()),
            "code": pa.array(code, pa.uint64()), "vec": vec if vec is not None else pa.array([b""] * n, pa.binary()),
            "home": pa.array(home, pa.int32()),
        }
    )  # fmt: skip


def part_entries(
    ids: np.ndarray,
    prio: np.ndarray,
    code: np.ndarray,
    mirror: np.ndarray,
    layout: Layout,
    phash_cells: Cells | None,
    embeddings: np.ndarray | None = None,
    embedding_cells: Cells | None = None,
    embedding_probes: int = EMBEDDING_PROBES,
) -> pa.Table:
    """Every entry of some samples (see the module), with its bucket and its sample's home partition (one per
    bucket); their embeddings go to `embedding_probes` cells (more for reference images)."""
    tables = []
    both = np.concatenate([code, mirror])
    both_ids, both_prio = np.concatenate([ids, ids]), np.concatenate([prio, prio])
    is_mirror = np.r_[np.zeros(len(code), bool), np.ones(len(mirror), bool)]
    cells = nearest_cells(signs(both), phash_cells, layout.probes)
    one_cell = phash_cells is None or len(phash_cells) <= 1
    home = home_partitions(ids, None if one_cell else cells[: len(ids), 0], layout.buckets)
    both_home = np.concatenate([home, home])
    blocks = hash_blocks(both)
    for j in range(4):
        block = blocks[:, j]
        tables.append(_entries(BLOCK, block, block_bucket(block, layout.buckets), both_ids, both_prio, is_mirror,
                               both, None, both_home))  # fmt: skip
    for p in range(cells.shape[1]):
        c = cells[:, p]
        tables.append(_entries(PHASH_CELL, c, (c % layout.buckets).astype(np.int32), both_ids, both_prio, is_mirror,
                               both, None, both_home))  # fmt: skip
    if embeddings is not None:
        x = np.ascontiguousarray(embeddings, np.float16)
        probes = min(embedding_probes, len(embedding_cells)) if embedding_cells is not None else 1
        cells = nearest_cells(x.astype(np.float32), embedding_cells, probes)
        vec = pa.array([bytes(v) for v in x.view(np.uint8).reshape(len(x), -1)], pa.binary())
        zeros = np.zeros(len(x), np.uint64)
        for p in range(cells.shape[1]):
            c = cells[:, p]
            bucket = (c % layout.buckets).astype(np.int32)
            tables.append(_entries(EMBEDDING_CELL, c, bucket, ids, prio, np.zeros(len(x), bool), zeros, vec, home))
    return pa.concat_tables(tables) if tables else ENTRY_SCHEMA.empty_table()


def write_entries(path: str | os.PathLike, table: pa.Table, layout: Layout, samples: int = 0) -> None:
    """A group's entries cut by bucket (shardsmith.formats.shuffle), in (kind, id) order within a bucket, so a
    bucket job reads its rows of every group without the rest; `samples` (the samples compared) with them."""
    table = table.cast(ENTRY_SCHEMA)
    order = np.lexsort((table["id"].to_numpy(), table["kind"].to_numpy()))
    table = table.take(pa.array(order))
    write_cut(path, ENTRY_SCHEMA, table, table["bucket"].to_numpy(), layout.buckets, {"samples": samples})


def merge_entries(path: str | os.PathLike, chunk_files: list[str], layout: Layout, samples: int = 0) -> None:
    """One entries file (write_entries' layout) from files written by write_entries for consecutive chunks of
    samples: each bucket's rows of every chunk file, in (kind, id) order as one write_entries would put them (an
    id's rows are all in one chunk file, in their order there). Holds one bucket at a time."""

    def buckets():
        for b in range(layout.buckets):
            rows = read_bucket(chunk_files, b)
            yield rows.take(pa.array(np.lexsort((rows["id"].to_numpy(), rows["kind"].to_numpy()))))

    write_buckets(path, ENTRY_SCHEMA, buckets(), {"samples": samples})


def entries_samples(path: str | os.PathLike) -> int:
    """The samples an entries file was written for (write_entries)."""
    return int(read_meta(path).get("samples", 0))


def read_bucket(paths: list[str], bucket: int) -> pa.Table:
    """A bucket's entries from every group's entries file."""
    return shuffle.read_bucket(paths, bucket, ENTRY_SCHEMA, "split it again")


def _same_hash(t: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
    """(sample, first sample with its very hash) pairs, and the ids searched: the first of each hash only, so a
    thousand copies of one placeholder image are one search row, not half a million pairs."""
    codes = t[~t["mirror"]].drop_duplicates("id").sort_values(["code", "prio", "id"], kind="stable")
    first = codes.drop_duplicates("code")
    rep = codes["code"].map(first.set_index("code")["id"])
    members = codes[rep.to_numpy() != codes["id"].to_numpy()]
    pairs = pd.DataFrame({"a": rep[members.index].to_numpy(), "b": members["id"].to_numpy(), "signal": SAME_HASH,
                          "score": 0.0})  # fmt: skip
    return pairs, members["id"].to_numpy()


def _block_pairs(t: pd.DataFrame, threshold: int) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Pairs within the threshold among block entries of one block that also agree on one of four 12-bit
    quarters of the other 48 bits (at most 3 differing bits leave one whole): runs stay short at any size."""
    if t.empty:
        return
    block, code, ids = t["block_or_cell"].to_numpy(), t["code"].to_numpy(np.uint64), t["id"].to_numpy()
    mirrored = t["mirror"].to_numpy(bool)
    j = (block >> 16).astype(np.uint64)
    for k in range(4):
        # the 48 bits outside block j, as four 12-bit quarters: bits of the code with block j's removed
        low = code & ((np.uint64(1) << (np.uint64(16) * j)) - np.uint64(1))
        high = code >> (np.uint64(16) * (j + np.uint64(1)))
        rest = low | (high << (np.uint64(16) * j))
        quarter = ((rest >> np.uint64(12 * k)) & np.uint64(0xFFF)).astype(np.int64)
        yield from same_key_pairs((block << np.int64(12)) | quarter, code, ids, threshold, mirrored)


def _by_cell(t: pd.DataFrame) -> Iterator[pd.DataFrame]:
    """The rows of each cell of cell entries sorted by cell (stably): what groupby(sort=True) gives, without its
    copy of the whole frame."""
    cell = t["block_or_cell"].to_numpy()
    cuts = np.flatnonzero(cell[1:] != cell[:-1]) + 1
    for start, end in zip(np.r_[0, cuts], np.r_[cuts, len(t)], strict=True):
        if end > start:
            yield t.iloc[start:end]


def _vectors(vec: np.ndarray) -> np.ndarray:
    """Entries' embeddings (fp16 bytes, one length) as one (n, d) array: joined in C, not a view a row."""
    return np.frombuffer(b"".join(vec), np.float16).reshape(len(vec), -1)


def _cell_pairs(t: pd.DataFrame, binary: bool, threshold: float, bin_size: int):
    """The near pairs of one cell, its hashes before its mirror hashes, each in dataset order (embeddings' k-means
    trains on a strided sample of that order; the hashes' tables find the same pairs in any order)."""
    t = t.iloc[np.lexsort((t["id"].to_numpy(), t["mirror"].to_numpy()))]
    ids = np.where(t["mirror"].to_numpy(bool), t["id"].to_numpy(np.int64) | MIRROR, t["id"].to_numpy(np.int64))
    if binary:
        x = t["code"].to_numpy(np.uint64)
    else:
        x = _vectors(t["vec"].to_numpy()) if len(t) else np.empty((0, 1), np.float16)
    return held_pairs(ids, x, threshold, binary, bin_size)


def _reference_pairs(t: pd.DataFrame, references: np.ndarray, threshold: int):
    """A cell's pairs of a reference image with any other row within the threshold, searched exactly (faiss'
    binary flat index) whatever the cell's size: the few references against every row of the cell, so that no
    near copy of one is left to the sampled-bit tables' recall. Pairs of two mirrored hashes are left out, as
    the search leaves them."""
    ids, mirrored = t["id"].to_numpy(np.int64), t["mirror"].to_numpy(bool)
    ref = np.isin(ids, references)
    if not ref.any() or ref.all():
        return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64)
    code, others, queries = t["code"].to_numpy(np.uint64), np.flatnonzero(~ref), np.flatnonzero(ref)

    def as_bytes(rows: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(code[rows]).view(np.uint8).reshape(-1, 8)

    index = faiss.IndexBinaryFlat(64)
    index.add(as_bytes(others))
    lims, dist, at = index.range_search(as_bytes(queries), threshold + 1)  # distances below the radius
    a, b = np.repeat(queries, np.diff(lims.astype(np.int64))), others[at]
    keep = ~(mirrored[a] & mirrored[b])
    return ids[a][keep], ids[b][keep], dist[keep].astype(np.int64)


_REFERENCE_CHUNK = 65_536  # a cell's rows whose embeddings are compared with the references at once


def _reference_embedding_pairs(t: pd.DataFrame, references: np.ndarray, threshold: float):
    """A cell's pairs of a reference image's embedding with any other row's at or over the threshold, exactly
    (every row against the few references, a chunk of rows at a time) whatever the cell's size, as
    _reference_pairs does for the hashes."""
    ids = t["id"].to_numpy(np.int64)
    ref = np.isin(ids, references)
    if not ref.any() or ref.all():
        return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.float32)
    vec = t["vec"].to_numpy()
    queries = _vectors(vec[ref]).astype(np.float32)
    others = np.flatnonzero(~ref)
    found = []
    for at in range(0, len(others), _REFERENCE_CHUNK):
        rows = others[at : at + _REFERENCE_CHUNK]
        x = _vectors(vec[rows]).astype(np.float32)
        q, r = np.nonzero(queries @ x.T >= threshold)
        found.append((ids[ref][q], ids[rows][r], np.einsum("ij,ij->i", queries[q], x[r])))
    return tuple(np.concatenate([f[i] for f in found]) for i in range(3))


def bucket_pairs(
    paths: list[str],
    bucket: int,
    phash_max_distance: int,
    embedding_min_similarity: float | None,
    bin_size: int,
) -> pd.DataFrame:
    """One bucket's pairs (a, b, prio_a, prio_b, signal, score, home_a, home_b): its same-hash pairs and its near
    pairs per signal (a before b by id), pairs of two published samples left out (both stay)."""
    # Memory follows the bucket's entries (about 6M at the default bucket size): each copy of them is freed
    # before the next is made, and the frames hold only the columns still read.
    table = read_bucket(paths, bucket)
    kind = table["kind"].to_numpy()
    ids, first = np.unique(table["id"].to_numpy(), return_index=True)
    prios, homes = table["prio"].to_numpy()[first], table["home"].to_numpy()[first]
    embedded = table.filter(pa.array(kind == EMBEDDING_CELL)) if embedding_min_similarity is not None else None
    # the hashes without their (empty) vector column: a Python object per entry would cost more than the rest
    hashed = table.filter(pa.array(kind != EMBEDDING_CELL)).select(
        ["block_or_cell", "kind", "id", "prio", "mirror", "code"]
    )
    del table, kind
    hashed = hashed.to_pandas()
    same, members = _same_hash(hashed)
    hashed = hashed.loc[~hashed["id"].isin(members), ["block_or_cell", "kind", "id", "mirror", "code"]]
    frames = [same]
    found = list(_block_pairs(hashed[hashed["kind"] == BLOCK], phash_max_distance))
    cells = hashed[hashed["kind"] == PHASH_CELL].sort_values("block_or_cell", kind="stable")
    del hashed
    references = ids[prios == REFERENCE_PRIORITY]
    for cell in _by_cell(cells):
        found.append(_cell_pairs(cell, True, phash_max_distance, bin_size))
        if len(references):
            found.append(_reference_pairs(cell, references, phash_max_distance))
    del cells
    if found:
        a, b, d = (np.concatenate([f[i] for f in found]) for i in range(3))
        a, b, d = best_pairs(a, b, d, True)
        frames.append(pd.DataFrame({"a": a, "b": b, "signal": "phash", "score": d.astype(np.float64)}))
    if embedded is not None:
        embedded = embedded.to_pandas().sort_values("block_or_cell", kind="stable")
        found = []
        for cell in _by_cell(embedded):
            found.append(_cell_pairs(cell, False, embedding_min_similarity, bin_size))
            if len(references):
                found.append(_reference_embedding_pairs(cell, references, embedding_min_similarity))
        del embedded
        if found:
            a, b, s = (np.concatenate([f[i] for f in found]) for i in range(3))
            a, b, s = best_pairs(a, b, s, False)
            frames.append(pd.DataFrame({"a": a, "b": b, "signal": "embedding", "score": s.astype(np.float64)}))
    pairs = pd.concat(frames, ignore_index=True)
    a, b = pairs["a"].to_numpy(np.int64), pairs["b"].to_numpy(np.int64)
    ordered = (pairs["signal"] == SAME_HASH).to_numpy()  # the first of the hash, then the other
    lo, hi = np.where(ordered, a, np.minimum(a, b)), np.where(ordered, b, np.maximum(a, b))
    pa_, pb = prios[np.searchsorted(ids, lo)], prios[np.searchsorted(ids, hi)]
    out = pd.DataFrame({"a": lo, "b": hi, "prio_a": pa_, "prio_b": pb, "signal": pairs["signal"].to_numpy(),
                        "score": pairs["score"].to_numpy(np.float64), "home_a": homes[np.searchsorted(ids, lo)],
                        "home_b": homes[np.searchsorted(ids, hi)]})  # fmt: skip
    keep = ~(is_published(pa_) & is_published(pb))
    return out[keep].sort_values(["a", "b", "signal"], kind="stable").reset_index(drop=True)


def write_cells(path: str | os.PathLike, layout: Layout, phash: Cells, embedding: Cells | None) -> None:
    """The layout and the cells every part's map uses (numpy's .npz; the layout in its json member)."""
    arrays = {"layout": np.frombuffer(json.dumps(vars(layout)).encode(), np.uint8)}
    for name, cells in (("phash", phash), ("embedding", embedding)):
        if cells is not None:
            arrays.update({name: cells.centroids, f"{name}_coarse": cells.coarse})
    with atomic_open(path) as f:
        np.savez(f, **arrays)


def read_cells(path: str | os.PathLike) -> tuple[Layout, Cells, Cells | None]:
    with np.load(path, allow_pickle=False) as z:
        layout = Layout(**json.loads(bytes(z["layout"]).decode()))
        phash, embedding = (
            Cells(z[name], z[f"{name}_coarse"]) if name in z.files else None for name in ("phash", "embedding")
        )
        return layout, phash, embedding
