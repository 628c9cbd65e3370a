"""The near-duplicate search as partitioned jobs: a map per part, a job per bucket, one small decision.

Map (`split_part`): every candidate sample of a part (one no other stage left out) becomes entries, each
with the sample's id (part index << 32 | row: dataset order) and its keep priority (`priority`):
- block entries: its hash and its mirror's, once for each of the four 16-bit blocks, grouped by (block,
  value). Two hashes at most 3 bits apart agree on one block whole (3 differing bits leave one of four
  blocks untouched), so they meet in one group whatever else happens;
- cell entries: its hash and its mirror's in the `CELL_PROBES` cells nearest to it, cells being k-means
  centroids trained once on a sample of the dataset (`train_cells`); hashes a few bits apart mostly share
  a cell, and each cell is searched alone (nearsearch.near_pairs: exact up to
  `bin_size`, binned above). With CLIP embeddings as a signal, their own cells the same way.
A bucket job (`bucket_pairs`) takes some groups (by hash) and some cells (cell mod buckets) from every
part's entries and writes the near pairs among them. Which bucket holds a group or a cell changes nothing
found: the bucket count sets the jobs' size, not the result. The cell count does (it follows the dataset's
size, `cell_count`); with one cell the search is the single search of the whole dataset.
"""

from __future__ import annotations

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
from shardsmith.formats.tables import key_hashes
from shardsmith.shards.neardecide import read_partition
from shardsmith.shards.nearsearch import MIRROR, SEED, best_pairs, near_pairs, same_key_pairs

_CHUNK = 100_000
CELL_PROBES = 2  # cells a vector goes to: a near pair is searched together when its vectors share one
CELL_TRAIN_PER_CENTROID = 64
BLOCK, PHASH_CELL, EMBEDDING_CELL = 0, 1, 2  # entry kinds
SIGNALS = {PHASH_CELL: "phash", EMBEDDING_CELL: "embedding"}
SAME_HASH = "same_hash"  # a pair of a sample and the first sample (in keep order) with its very hash
PUBLISHED_BIT = np.uint64(1 << 63)  # set in the priority of a sample NOT published: published ones sort first
_AREA_BITS, _BYTES_BITS = 35, 28

ENTRY_SCHEMA = pa.schema(
    [("bucket", pa.int32()), ("group", pa.int64()), ("kind", pa.int8()), ("id", pa.int64()),
     ("prio", pa.uint64()), ("mirror", pa.bool_()), ("code", pa.uint64()), ("vec", pa.binary()),
     ("home", pa.int32())]
)  # fmt: skip


def sample_id(part: int, row: np.ndarray) -> np.ndarray:
    """Ids in dataset order: the part's index in the high half, the samples table's row in the low."""
    return (np.int64(part) << np.int64(32)) | np.asarray(row, np.int64)


def split_id(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ids = np.asarray(ids, np.int64)
    return ids >> np.int64(32), ids & np.int64(0xFFFF_FFFF)


def priority(published: np.ndarray, area: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
    """The keep order as one number, smallest first (ties by id, the earliest record): a sample already
    published, then the largest image (pixels before resizing), then the largest file (at equal pixels, the
    copy compressed least). Areas over 2^35 pixels and files over 256 MiB count as those."""
    area = np.minimum(np.asarray(area, np.int64), (1 << _AREA_BITS) - 1).astype(np.uint64)
    nbytes = np.minimum(np.asarray(nbytes, np.int64), (1 << _BYTES_BITS) - 1).astype(np.uint64)
    inv_area = np.uint64((1 << _AREA_BITS) - 1) - area
    inv_bytes = np.uint64((1 << _BYTES_BITS) - 1) - nbytes
    prio = (inv_area << np.uint64(_BYTES_BITS)) | inv_bytes
    return np.where(np.asarray(published, bool), prio, prio | PUBLISHED_BIT)


def is_published(prio: np.ndarray) -> np.ndarray:
    return (np.asarray(prio, np.uint64) & PUBLISHED_BIT) == 0


@dataclass(frozen=True)
class Layout:
    """How the search is cut: `cells` per signal (what is compared: it follows the dataset's size) and
    `buckets`, the jobs that share the groups and cells out (free: the same pairs for any count)."""

    cells: int
    buckets: int


def cell_count(samples: int, cell_samples: int) -> int:
    """Cells of about `cell_samples` samples each (every sample is in CELL_PROBES of them, twice: hash and
    mirror)."""
    return max(1, math.ceil(samples * CELL_PROBES / cell_samples))


def bucket_count(samples: int, bucket_samples: int, override: int | None = None) -> int:
    return override if override else max(1, math.ceil(samples / bucket_samples))


def signs(codes: np.ndarray) -> np.ndarray:
    bits = np.unpackbits(np.asarray(codes, np.uint64).astype(">u8").view(np.uint8).reshape(-1, 8), axis=1)
    return bits.astype(np.float32) * 2 - 1


def train_cells(sample: np.ndarray, cells: int, binary: bool) -> np.ndarray:
    """k-means centroids (fixed seed) for `cells` cells from a sample of hashes (binary) or embeddings."""
    x = signs(sample) if binary else np.ascontiguousarray(sample, np.float32)
    if cells <= 1 or len(x) == 0:
        return np.zeros((0, x.shape[1] if x.ndim == 2 else 64), np.float32)
    cells = min(cells, len(x))
    km = faiss.Kmeans(x.shape[1], cells, niter=12, seed=SEED, max_points_per_centroid=CELL_TRAIN_PER_CENTROID * 4)
    km.train(x)
    return km.centroids


def nearest_cells(x: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """(n, CELL_PROBES) cells of each vector (all 0 with one cell)."""
    if centroids is None or len(centroids) <= 1:
        return np.zeros((len(x), 1), np.int64)
    index = faiss.IndexFlatL2(centroids.shape[1])
    index.add(np.ascontiguousarray(centroids, np.float32))
    _, found = index.search(np.ascontiguousarray(x, np.float32), min(CELL_PROBES, len(centroids)))
    return found.astype(np.int64)


def block_groups(codes: np.ndarray) -> np.ndarray:
    """(n, 4) group of each hash for each 16-bit block j: j << 16 | the block's value."""
    j = np.arange(4, dtype=np.uint64)
    blocks = (np.asarray(codes, np.uint64)[:, None] >> (np.uint64(16) * j)) & np.uint64(0xFFFF)
    return (j.astype(np.int64) << np.int64(16)) | blocks.astype(np.int64)


def group_bucket(groups: np.ndarray, buckets: int) -> np.ndarray:
    if buckets == 1:
        return np.zeros(len(groups), np.int32)
    return (key_hashes(pd.Series(groups.astype(str))) % np.uint64(buckets)).astype(np.int32)


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


def _entries(kind: int, group: np.ndarray, bucket: np.ndarray, ids, prio, mirror, code, vec, home) -> pa.Table:
    n = len(group)
    return pa.table(
        {
            "bucket": pa.array(bucket, pa.int32()), "group": pa.array(group, pa.int64()),
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
    phash_centroids: np.ndarray,
    embeddings: np.ndarray | None = None,
    embedding_centroids: np.ndarray | None = None,
) -> pa.Table:
    """Every entry of some samples (see the module), with its bucket and its sample's home partition (one per
    bucket)."""
    tables = []
    both = np.concatenate([code, mirror])
    both_ids, both_prio = np.concatenate([ids, ids]), np.concatenate([prio, prio])
    is_mirror = np.r_[np.zeros(len(code), bool), np.ones(len(mirror), bool)]
    cells = nearest_cells(signs(both), phash_centroids)
    one_cell = phash_centroids is None or len(phash_centroids) <= 1
    home = home_partitions(ids, None if one_cell else cells[: len(ids), 0], layout.buckets)
    both_home = np.concatenate([home, home])
    groups = block_groups(both)
    for j in range(4):
        g = groups[:, j]
        tables.append(_entries(BLOCK, g, group_bucket(g, layout.buckets), both_ids, both_prio, is_mirror, both, None,
                               both_home))  # fmt: skip
    for p in range(cells.shape[1]):
        c = cells[:, p]
        tables.append(_entries(PHASH_CELL, c, (c % layout.buckets).astype(np.int32), both_ids, both_prio, is_mirror,
                               both, None, both_home))  # fmt: skip
    if embeddings is not None:
        x = np.ascontiguousarray(embeddings, np.float16)
        cells = nearest_cells(x.astype(np.float32), embedding_centroids)
        vec = pa.array([bytes(v) for v in x.view(np.uint8).reshape(len(x), -1)], pa.binary())
        zeros = np.zeros(len(x), np.uint64)
        for p in range(cells.shape[1]):
            c = cells[:, p]
            bucket = (c % layout.buckets).astype(np.int32)
            tables.append(_entries(EMBEDDING_CELL, c, bucket, ids, prio, np.zeros(len(x), bool), zeros, vec, home))
    return pa.concat_tables(tables) if tables else ENTRY_SCHEMA.empty_table()


def write_entries(path: str | os.PathLike, table: pa.Table, layout: Layout, samples: int = 0) -> None:
    """An Arrow IPC file with one record batch per bucket (in bucket order, empty ones too), so a bucket job
    reads its rows of every part without the rest; `samples` (the samples compared) in its metadata."""
    table = table.cast(ENTRY_SCHEMA)
    order = np.lexsort((table["id"].to_numpy(), table["kind"].to_numpy(), table["bucket"].to_numpy()))
    table = table.take(pa.array(order))
    bucket = table["bucket"].to_numpy()
    starts = np.searchsorted(bucket, np.arange(layout.buckets + 1))
    schema = ENTRY_SCHEMA.with_metadata({"samples": str(samples)})
    with atomic_open(path) as f, pa.ipc.new_file(f, schema) as w:
        for b in range(layout.buckets):
            piece = table.slice(int(starts[b]), int(starts[b + 1] - starts[b])).combine_chunks()
            batch = piece.to_batches()[0] if piece.num_rows else _empty_batch()
            w.write_batch(batch.replace_schema_metadata(schema.metadata))


def _empty_batch() -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in ENTRY_SCHEMA], schema=ENTRY_SCHEMA)


def entries_samples(path: str | os.PathLike) -> int:
    """The samples an entries file was written for (write_entries)."""
    with pa.memory_map(str(path)) as src:
        return int((pa.ipc.open_file(src).schema.metadata or {}).get(b"samples", b"0"))


def read_bucket(paths: list[str], bucket: int) -> pa.Table:
    """A bucket's entries from every part's entries file."""
    return read_partition(paths, bucket, ENTRY_SCHEMA, "split it again")


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
    """Pairs within the threshold among entries of one block group that also agree on one of four 12-bit
    pieces of the other 48 bits (at most 3 differing bits leave one whole): runs stay short at any size."""
    if t.empty:
        return
    group, code, ids = t["group"].to_numpy(), t["code"].to_numpy(np.uint64), t["id"].to_numpy()
    mirrored = t["mirror"].to_numpy(bool)
    j = (group >> 16).astype(np.uint64)
    for k in range(4):
        # the 48 bits outside block j, as four 12-bit pieces: bits of the code with block j's removed
        low = code & ((np.uint64(1) << (np.uint64(16) * j)) - np.uint64(1))
        high = code >> (np.uint64(16) * (j + np.uint64(1)))
        rest = low | (high << (np.uint64(16) * j))
        piece = ((rest >> np.uint64(12 * k)) & np.uint64(0xFFF)).astype(np.int64)
        yield from same_key_pairs((group << np.int64(12)) | piece, code, ids, threshold, mirrored)


def _cell_pairs(t: pd.DataFrame, binary: bool, threshold: float, bin_size: int, scratch: str | None):
    """near_pairs over one cell, its hashes before its mirror hashes, each in dataset order: the order the
    search of the whole dataset reads them in (k-means trains on a strided sample of it)."""
    t = t.iloc[np.lexsort((t["id"].to_numpy(), t["mirror"].to_numpy()))]
    ids = np.where(t["mirror"].to_numpy(bool), t["id"].to_numpy(np.int64) | MIRROR, t["id"].to_numpy(np.int64))
    if binary:
        x = t["code"].to_numpy(np.uint64)
    else:
        x = np.stack([np.frombuffer(v, np.float16) for v in t["vec"]]) if len(t) else np.empty((0, 1), np.float16)

    def chunks() -> Iterator[tuple[np.ndarray, np.ndarray]]:  # in slices: the search converts each to floats
        for at in range(0, len(ids), _CHUNK):
            yield ids[at : at + _CHUNK], x[at : at + _CHUNK]

    return near_pairs(chunks, len(ids), threshold, binary, bin_size, scratch)


def bucket_pairs(
    paths: list[str],
    bucket: int,
    phash_max_distance: int,
    embedding_min_similarity: float | None,
    bin_size: int,
    scratch: str | None = None,
) -> pd.DataFrame:
    """One bucket's pairs (a, b, prio_a, prio_b, signal, score, home_a, home_b): its same-hash pairs and its near
    pairs per signal (a before b by id), pairs of two published samples left out (both stay)."""
    table = read_bucket(paths, bucket)
    kind = table["kind"].to_numpy()
    # the hashes without their (empty) vector column: a Python object per entry would cost more than the rest
    hashed = table.filter(pa.array(kind != EMBEDDING_CELL)).drop_columns(["vec"]).to_pandas()
    ids, first = np.unique(table["id"].to_numpy(), return_index=True)
    prios, homes = table["prio"].to_numpy()[first], table["home"].to_numpy()[first]
    same, members = _same_hash(hashed)
    hashed = hashed[~hashed["id"].isin(members)]
    frames = [same]
    found = list(_block_pairs(hashed[hashed["kind"] == BLOCK], phash_max_distance))
    cells = hashed[hashed["kind"] == PHASH_CELL]
    for _, cell in cells.groupby("group", sort=True):
        found.append(_cell_pairs(cell, True, phash_max_distance, bin_size, scratch))
    if found:
        a, b, d = (np.concatenate([f[i] for f in found]) for i in range(3))
        a, b, d = best_pairs(a, b, d, True)
        frames.append(pd.DataFrame({"a": a, "b": b, "signal": "phash", "score": d.astype(np.float64)}))
    if embedding_min_similarity is not None:
        found = [
            _cell_pairs(cell, False, embedding_min_similarity, bin_size, scratch)
            for _, cell in table.filter(pa.array(kind == EMBEDDING_CELL)).to_pandas().groupby("group", sort=True)
        ]
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


def write_cells(path: str | os.PathLike, layout: Layout, phash: np.ndarray, embedding: np.ndarray | None) -> None:
    """The layout and the centroids every part's map uses (numpy's .npz; the layout in its json member)."""
    arrays = {"phash": phash, "layout": np.frombuffer(json.dumps(vars(layout)).encode(), np.uint8)}
    if embedding is not None:
        arrays["embedding"] = embedding
    with atomic_open(path) as f:
        np.savez(f, **arrays)


def read_cells(path: str | os.PathLike) -> tuple[Layout, np.ndarray, np.ndarray | None]:
    with np.load(path, allow_pickle=False) as z:
        layout = Layout(**json.loads(bytes(z["layout"]).decode()))
        return layout, z["phash"], z["embedding"] if "embedding" in z.files else None
