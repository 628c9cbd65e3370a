"""Near-duplicate images within the version being built and against the published versions.

Two signals: the perceptual hash of every published image (shardsmith.download.process.phash, computed where the
image is decoded: resized, recompressed, slightly cropped and mirrored copies) and, with embed.enabled and a
threshold set, the cosine similarity of the CLIP image embeddings (the same content reshot or re-edited). Pairs are
found by jobs that each see a part of the dataset (shardsmith.shards.nearparts: a map per part, a job per bucket),
then decided by one job that holds only the pairs (`decide`). Each group keeps one sample by a fixed rule, so a
rebuild keeps the same one:

1. a sample already published (its source_id is in a published version) is always kept;
2. then the largest image (pixels before resizing);
3. then, at equal pixels, the largest file as fetched (the copy compressed least);
4. then the earliest record (part order, record order within the part).

Samples are visited in that order; each one not yet taken keeps its near neighbours that are not taken yet,
so every sample left out is within the threshold of the sample it names (no chains). With `near: exclude`
those land in the ledger (stage dedupe, reason near_duplicate); with `report` they are only reported.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from shardsmith.core.atomic import atomic_open, atomic_write_text
from shardsmith.core.errors import ConfigError
from shardsmith.core.ledger import DEDUPE, EXCLUSION_COLUMNS
from shardsmith.shards.buckets import dropped_ids, ledger_piece, write_ledger_piece
from shardsmith.shards.nearparts import (
    CELL_TRAIN_PER_CENTROID,
    ENTRY_SCHEMA,
    SAME_HASH,
    Layout,
    bucket_count,
    bucket_pairs,
    cell_count,
    is_published,
    part_entries,
    priority,
    read_cells,
    sample_id,
    split_id,
    train_cells,
    write_cells,
    write_entries,
)

REASON = "near_duplicate"
NEAR_COLUMNS = ["key", "kept_key", "kept_version", "signal", "distance", "part", "kept_part"]
MODES = ("report", "exclude", "off")


@dataclass(frozen=True)
class NearSettings:
    """The config's `dedupe` section."""

    near: str = "report"  # report | exclude | off
    phash_max_distance: int = 8  # Hamming distance (of 64 bits) at or under which two images are near
    embedding_min_similarity: float | None = None  # cosine similarity at or over which two images are near
    bin_size: int = 20_000  # vectors searched together (shardsmith.shards.nearsearch): bounds the step's memory
    cell_samples: int = 1_000_000  # samples a cell holds (nearparts): more cells, smaller searches
    bucket_samples: int = 500_000  # samples' entries a bucket job reads: sets the jobs' size
    buckets: int | None = None  # bucket jobs; None: from the dataset's size and bucket_samples

    def __post_init__(self) -> None:
        if self.near not in MODES:
            raise ConfigError(f"dedupe.near must be one of {', '.join(MODES)}, got {self.near!r}")
        if not 0 <= self.phash_max_distance <= 32:
            raise ConfigError(f"dedupe.phash_max_distance must be in 0..32, got {self.phash_max_distance}")
        s = self.embedding_min_similarity
        if s is not None and not 0 < s <= 1:
            raise ConfigError(f"dedupe.embedding_min_similarity must be in (0, 1] or null, got {s}")
        if self.bin_size < 100:
            raise ConfigError(f"dedupe.bin_size must be >= 100, got {self.bin_size}")
        if self.buckets is not None and self.buckets < 1:
            raise ConfigError(f"dedupe.buckets must be >= 1 or null, got {self.buckets}")

    def layout(self, samples: int) -> Layout:
        """Cells and bucket jobs for a dataset of this many samples."""
        return Layout(cells=cell_count(samples, self.cell_samples),
                      buckets=bucket_count(samples, self.bucket_samples, self.buckets))  # fmt: skip


def _codes(hexes: pd.Series) -> np.ndarray:
    """16-hex-digit hashes as uint64, without a Python int per hash."""
    return np.frombuffer(bytes.fromhex("".join(hexes.to_numpy(dtype=str))), dtype=">u8").astype(np.uint64)


@dataclass
class Published:
    """What the search needs of the published versions: which samples of this build are already published
    (`old`: part, row, version), and the published samples no longer in it (`gone`: key, version and hashes;
    they take part as the part after the last, as keepers only)."""

    versions: list[str]
    old: pd.DataFrame
    gone: pd.DataFrame


GONE_COLUMNS = ["key", "version", "width_before", "height_before", "phash", "phash_mirror"]


def published_candidates(sample_paths: list[str], excluded: set[str], published: pd.DataFrame | None) -> Published:
    """Split the published records (dedupe.published_records) into this build's samples already published
    and those no longer in it; a sample another stage left out counts as no longer in it."""
    if published is None or published.empty:
        return Published([], pd.DataFrame({"part": [], "row": [], "version": []}), pd.DataFrame(columns=GONE_COLUMNS))
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


def part_candidates(
    samples_path: str, part: int, dropped_rows: np.ndarray, old_rows: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(ids, priorities, hashes, mirror hashes, rows) of a part's samples that no other step left out (its
    rows `dropped_rows`)."""
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
    prio = priority(np.isin(rows, old_rows), area, nbytes)
    return sample_id(part, rows), prio, _codes(t["phash"]), _codes(t["phash_mirror"]), rows


def gone_candidates(gone: pd.DataFrame, part: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    area = gone["width_before"].to_numpy(np.int64) * gone["height_before"].to_numpy(np.int64)
    prio = priority(np.ones(len(gone), bool), area, np.zeros(len(gone), np.int64))
    return sample_id(part, np.arange(len(gone))), prio, _codes(gone["phash"]), _codes(gone["phash_mirror"])


def decide(pairs: pd.DataFrame) -> pd.DataFrame:
    """(out, kept, signal, score) for every sample left out, in keep order, from every bucket's pairs (which
    may repeat).

    The rule: samples are visited in keep order (priority, then id); one not yet taken takes its near
    neighbours not yet taken (a published one is never taken), so a sample is left out exactly when its
    earliest kept neighbour comes before it, and it names that one. Decided in rounds over the pairs, not
    sample by sample: a sample is settled once its neighbours before it are, up to the first kept one, so a
    group of copies takes two rounds and only chains of near pairs take more. A sample with the very hash of
    an earlier one (same_hash) is not searched: it goes out for that one when it is kept, else for its keeper.
    """
    cols = ["out", "kept", "signal", "score"]
    if pairs.empty:
        return pd.DataFrame({c: pd.Series(dtype=t) for c, t in zip(cols, ["int64", "int64", "str", "float64"])})
    same = pairs[pairs["signal"] == SAME_HASH].drop_duplicates(["a", "b"])
    near = pairs[pairs["signal"] != SAME_HASH]
    members = same["b"].to_numpy()
    near = near[~near["a"].isin(members) & ~near["b"].isin(members)]
    a, b = near["a"].to_numpy(np.int64), near["b"].to_numpy(np.int64)
    pa_, pb = near["prio_a"].to_numpy(np.uint64), near["prio_b"].to_numpy(np.uint64)
    first = (pa_ < pb) | ((pa_ == pb) & (a < b))
    u, v = np.where(first, a, b), np.where(first, b, a)
    pu, pv = np.where(first, pa_, pb), np.where(first, pb, pa_)
    signal, score = near["signal"].to_numpy(), near["score"].to_numpy(np.float64)
    ok = ~is_published(pv)  # a published sample is never left out
    u, v, pu, pv, signal, score = u[ok], v[ok], pu[ok], pv[ok], signal[ok], score[ok]
    # one row per pair: the perceptual signal first (its pair is named), then the nearest
    by = np.lexsort((np.where(signal == "phash", score, -score), signal != "phash", v, u))
    u, v, pu, pv, signal, score = u[by], v[by], pu[by], pv[by], signal[by], score[by]
    one = np.r_[True, (u[1:] != u[:-1]) | (v[1:] != v[:-1])] if len(u) else np.empty(0, bool)
    u, v, pu, pv, signal, score = u[one], v[one], pu[one], pv[one], signal[one], score[one]
    # samples in keep order: rank 0 first
    ids = np.concatenate([u, v])
    prios = np.concatenate([pu, pv])
    order = np.lexsort((ids, prios))
    ids_sorted = ids[order]
    keep = np.r_[True, ids_sorted[1:] != ids_sorted[:-1]] if len(ids_sorted) else np.empty(0, bool)
    node_ids = ids_sorted[keep]  # in keep order
    rank_of = pd.Index(node_ids)
    ru, rv = rank_of.get_indexer(u), rank_of.get_indexer(v)
    status = np.zeros(len(node_ids), np.int8)  # 0 unknown, 1 kept, 2 left out
    keeper = np.full(len(node_ids), -1, np.int64)  # the pair that left it out
    incoming = np.zeros(len(node_ids), bool)
    incoming[rv] = True
    status[~incoming] = 1
    by_v = np.lexsort((ru, rv))
    ru, rv = ru[by_v], rv[by_v]
    pair_of = by_v
    starts = np.flatnonzero(np.r_[True, rv[1:] != rv[:-1]]) if len(rv) else np.empty(0, np.int64)
    ends = np.r_[starts[1:], len(rv)]
    group_v = rv[starts]
    while (status[group_v] == 0).any():
        s = status[ru]
        cand = np.where(s != 2, np.arange(len(ru)), len(ru))
        firsts = np.minimum.reduceat(cand, starts)
        todo = status[group_v] == 0
        none = todo & (firsts >= ends)  # every neighbour before it left out: kept
        at = np.minimum(firsts, len(ru) - 1)
        taken = todo & (firsts < ends) & (s[at] == 1)
        if not (none.any() or taken.any()):
            raise RuntimeError("near-duplicate decision made no progress")  # cannot happen: the least unknown settles
        status[group_v[none]] = 1
        status[group_v[taken]] = 2
        keeper[group_v[taken]] = pair_of[at[taken]]
    out_nodes = np.flatnonzero(status == 2)
    k = keeper[out_nodes]
    decided = {
        int(node_ids[n]): (int(u[p]), str(signal[p]), float(score[p])) for n, p in zip(out_nodes, k, strict=True)
    }
    same_prio = dict(zip(same["b"].to_numpy().tolist(), same["prio_b"].to_numpy().tolist(), strict=True))
    rows = [(o, kept, sig, sc) for o, (kept, sig, sc) in decided.items()]
    for rep, member, pm in zip(same["a"].to_numpy(), same["b"].to_numpy(), same["prio_b"].to_numpy(), strict=True):
        if is_published(np.uint64(pm)):
            continue
        got = decided.get(int(rep))
        rows.append((int(member), *(got if got else (int(rep), "phash", 0.0))))
    prio = {**dict(zip(ids.tolist(), prios.tolist(), strict=True)), **same_prio}
    rows.sort(key=lambda r: (prio[r[0]], r[0]))
    return pd.DataFrame(rows, columns=cols)


def _keys_of(ids: np.ndarray, sample_paths: list[str], gone: pd.DataFrame) -> dict[int, str]:
    """The keys of some samples, read back from their parts' samples tables (or the published ones)."""
    part, row = split_id(ids)
    out: dict[int, str] = {}
    for p in np.unique(part):
        take = part == p
        if p == len(sample_paths):
            keys = gone["key"].to_numpy()
        else:
            keys = pd.read_parquet(sample_paths[p], columns=["key"])["key"].to_numpy()
        out.update(zip(ids[take].tolist(), (str(k) for k in keys[row[take]]), strict=True))
    return out


def near_rows(
    decided: pd.DataFrame, sample_paths: list[str], part_ids: list[str], published: Published
) -> pd.DataFrame:
    """NEAR_COLUMNS rows for the samples left out: keys, the kept sample's version and both parts."""
    ids = np.unique(np.r_[decided["out"].to_numpy(np.int64), decided["kept"].to_numpy(np.int64)])
    keys = _keys_of(ids, sample_paths, published.gone)
    old = published.old
    old_ids = (old["part"].to_numpy(np.int64) << 32) | old["row"].to_numpy(np.int64)
    version = dict(zip(old_ids.tolist(), old["version"], strict=True))
    n = len(sample_paths)
    gone_version = published.gone["version"].to_numpy()

    def where(i: int) -> tuple[str, str]:
        p, r = int(i) >> 32, int(i) & 0xFFFF_FFFF
        if p == n:
            return "", str(gone_version[r])
        return part_ids[p], str(version.get(int(i), ""))

    rows = []
    for o, k, sig, score in decided.itertuples(index=False):
        (op, _), (kp, kv) = where(o), where(k)
        rows.append([keys[o], keys[k], kv, sig, score, op, kp])
    return pd.DataFrame(rows, columns=NEAR_COLUMNS)


def find_near_duplicates(
    sample_paths: list[str],
    part_ids: list[str],
    s: NearSettings,
    excluded: set[str] = frozenset(),
    published: pd.DataFrame | None = None,
    embedding_paths: list[str] = (),
    scratch: str | None = None,
    layout: Layout | None = None,
    work: str | None = None,
) -> tuple[pd.DataFrame, int]:
    """The partitioned search run in one process (map every part, each bucket, then decide): NEAR_COLUMNS rows
    for the samples of this build that are near-duplicates of a kept sample, and how many were compared.
    The workflow runs the same steps as jobs (rules/shards.smk); `layout` defaults to one cell, one bucket."""
    import tempfile

    sample_paths, embedding_paths = list(sample_paths), list(embedding_paths)
    pub = published_candidates(sample_paths, set(excluded), published)
    layout = layout or Layout(cells=1, buckets=1)
    left_out = pd.Index(sorted(excluded))
    dropped = [
        np.flatnonzero(left_out.get_indexer(pd.read_parquet(p, columns=["key"])["key"]) >= 0)
        if len(left_out)
        else np.empty(0, np.int64)
        for p in sample_paths
    ]
    with tempfile.TemporaryDirectory(prefix="shardsmith-near-", dir=work) as tmp:
        cells = train_part_cells(sample_paths, layout, s, embedding_paths)
        entries, compared = [], 0
        for p, path in enumerate(sample_paths):
            out = f"{tmp}/{p}.arrow"
            compared += split_part(path, p, dropped[p], pub.old, layout, cells, out,
                                   embedding_paths[p] if s.embedding_min_similarity is not None and embedding_paths
                                   else None)  # fmt: skip
            entries.append(out)
        out = f"{tmp}/published.arrow"
        split_gone(pub.gone, len(sample_paths), layout, cells, out)
        entries.append(out)
        pairs = pd.concat(
            [bucket_pairs(entries, b, s.phash_max_distance, s.embedding_min_similarity if embedding_paths else None,
                          s.bin_size, scratch, layout.cells) for b in range(layout.buckets)],
            ignore_index=True,
        )  # fmt: skip
    return near_rows(decide(pairs), sample_paths, list(part_ids), pub), compared


def train_part_cells(
    sample_paths: list[str], layout: Layout, s: NearSettings, embedding_paths: list[str] = ()
) -> tuple[np.ndarray, np.ndarray | None]:
    """Cell centroids from an evenly strided sample of the hashes (and embeddings, when used) of evenly strided
    parts: enough parts for four times the training points, not every part (LAION-5B has tens of thousands)."""
    if layout.cells <= 1:
        return np.zeros((0, 64), np.float32), None
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
                vecs.append(z["image"][take].astype(np.float32))
        seen += len(t)
    phash = train_cells(np.concatenate(codes), layout.cells, True)
    embedding = train_cells(np.concatenate(vecs), layout.cells, False) if vecs else None
    return phash, embedding


def split_part(
    samples_path: str,
    part: int,
    dropped_rows: np.ndarray,
    old: pd.DataFrame,
    layout: Layout,
    cells: tuple[np.ndarray, np.ndarray | None],
    out: str,
    embeddings_path: str | None = None,
) -> int:
    """Write a part's entries (shardsmith.shards.nearparts) to `out`; returns the samples compared."""
    old_rows = old["row"].to_numpy()[old["part"].to_numpy() == part] if len(old) else np.empty(0, np.int64)
    ids, prio, code, mirror, rows = part_candidates(samples_path, part, dropped_rows, old_rows)
    emb = _part_embeddings(embeddings_path, samples_path, rows) if embeddings_path is not None else None
    write_entries(out, part_entries(ids, prio, code, mirror, layout, cells[0], emb, cells[1]), layout, len(ids))
    return len(ids)


def split_gone(gone: pd.DataFrame, part: int, layout: Layout, cells: tuple, out: str) -> None:
    """The published samples no longer in the build, as entries of the part after the last."""
    ids, prio, code, mirror = gone_candidates(gone, part)
    write_entries(out, part_entries(ids, prio, code, mirror, layout, cells[0]), layout)


def describe(row: dict) -> str:
    """The ledger detail of a sample left out: the kept sample and how near it is."""
    where = f" (published in {row['kept_version']})" if row["kept_version"] else ""
    if row["signal"] == "phash":
        how = f"pHash distance {int(row['distance'])} of 64 bits"
    else:
        how = f"CLIP image cosine similarity {row['distance']:.4f}"
    return f"near-duplicate of {row['kept_key']}{where}: {how}"


def exclusions(near: pd.DataFrame) -> pd.DataFrame:
    """Exclusion rows (key, stage, reason, detail) for plan_shards, one per sample left out."""
    rows = [[r["key"], DEDUPE, REASON, describe(r)] for r in near.to_dict("records")]
    return pd.DataFrame(rows, columns=EXCLUSION_COLUMNS)


def summary(near: pd.DataFrame, samples: int) -> dict:
    """Counts for the log, the report and the card: groups, samples in them, and distances per signal."""
    out = {"samples_compared": samples, "groups": int(near["kept_key"].nunique()), "near_duplicates": len(near)}
    out["samples_in_groups"] = out["groups"] + out["near_duplicates"]
    hist = {}
    for signal, g in near.groupby("signal"):
        values = g["distance"].astype(int) if signal == "phash" else (g["distance"] * 100).round().astype(int) / 100
        hist[str(signal)] = {str(k): int(v) for k, v in values.value_counts().sort_index().items()}
    out["distances"] = hist
    return out


def write_tables(near: pd.DataFrame, out_dir: str | Path, exclude: bool) -> list[str]:
    """near_duplicates.parquet (always) and, with exclude, the exclusion table plan_shards reads; returns the
    exclusion tables written."""
    out_dir = Path(out_dir)
    with atomic_open(out_dir / "near_duplicates.parquet") as f:
        near.to_parquet(f, index=False)
    if not exclude:
        return []
    with atomic_open(out_dir / "near_exclusions.parquet") as f:
        exclusions(near).to_parquet(f, index=False)
    return [str(out_dir / "near_exclusions.parquet")]


# The workflow's jobs (rules/shards.smk), in their order: find_published (shardsmith.shards.dedupe), then
# train_near_cells, split_near_part per part, find_near_pairs per bucket, decide_near_duplicates.


def write_near_piece(
    decided: pd.DataFrame, found: pd.DataFrame, sample_paths: list[str], part_ids: list[str], exclude: bool, out
) -> None:
    """The ledger piece of the samples left out (stage dedupe, reason near_duplicate), with each part's count
    for the plan; empty with `report`."""
    n = len(decided) if exclude else 0
    drops = pd.DataFrame({"id": decided["out"].to_numpy(np.int64)[:n], "stage": DEDUPE, "reason": REASON,
                          "detail": [describe(r) for r in found.iloc[:n].to_dict("records")]})  # fmt: skip
    rows = ledger_piece(drops, dict(enumerate(sample_paths)))
    dropped = pd.Series(rows["id"].to_numpy(np.int64) >> np.int64(32)).value_counts()
    write_ledger_piece(out, rows, {p: [0, int(dropped.get(i, 0))] for i, p in enumerate(part_ids)})


def read_published(old_path: str, gone_path: str) -> Published:
    old, gone = pd.read_parquet(old_path), pd.read_parquet(gone_path)
    return Published(sorted(set(old["version"]) | set(gone["version"])), old, gone)


def write_published(pub: Published, old_path: str | Path, gone_path: str | Path) -> None:
    for frame, path in ((pub.old, old_path), (pub.gone, gone_path)):
        with atomic_open(path) as f:
            frame.to_parquet(f, index=False)


def no_published() -> Published:
    return published_candidates([], set(), None)


def excluded_keys(exclusions: list[str]) -> pd.Index:
    """Keys other stages left out (their exclusion tables): not compared, so they keep nothing out."""
    keys = [pd.read_parquet(p, columns=["key"])["key"] for p in exclusions]
    return pd.Index(sorted(set(pd.concat(keys)))) if keys else pd.Index([])


def train_near_cells(
    sample_paths: list[str], s: NearSettings, samples: int, published: Published, embedding_paths: list[str],
    out_cells: str, out_published: str,
) -> Layout:  # fmt: skip
    """The cells' centroids for a dataset of about `samples` samples, and the published samples' entries."""
    layout = s.layout(samples)
    cells = train_part_cells(sample_paths, layout, s, embedding_paths)
    write_cells(out_cells, layout, cells[0], cells[1])
    split_gone(published.gone, len(sample_paths), layout, cells, out_published)
    return layout


def split_near_group(
    samples: list[str], first_part: int, dropped_piece: str, old_path: str | None, cells_path: str, out: str,
    embeddings: list[str],
) -> int:  # fmt: skip
    """The near-duplicate entries of a group's parts: their samples that the exact steps kept (the group's
    ledger piece names the others), in one file, one batch per bucket; returns the samples compared."""
    layout, phash, embedding = read_cells(cells_path)
    tables, n = [], 0
    for i, path in enumerate(samples):
        part = first_part + i
        dropped = dropped_ids([dropped_piece], part) & np.int64(0xFFFF_FFFF)
        old = pd.read_parquet(old_path, filters=[("part", "=", part)]) if old_path else no_published().old
        old_rows = old["row"].to_numpy() if len(old) else np.empty(0, np.int64)
        ids, prio, code, mirror, rows = part_candidates(path, part, dropped, old_rows)
        emb = _part_embeddings(embeddings[i], path, rows) if embeddings else None
        tables.append(part_entries(ids, prio, code, mirror, layout, phash, emb, embedding))
        n += len(ids)
    write_entries(out, pa.concat_tables(tables) if tables else ENTRY_SCHEMA.empty_table(), layout, n)
    return n


def _part_embeddings(embeddings_path: str, samples_path: str, rows: np.ndarray) -> np.ndarray:
    with np.load(embeddings_path, allow_pickle=False) as z:
        keys, image = z["key"], z["image"]
    if not np.array_equal(keys, pd.read_parquet(samples_path, columns=["key"])["key"].to_numpy(dtype=str)):
        raise ValueError(f"{embeddings_path} does not hold the rows of {samples_path}: run embed_part for it again")
    return image[rows]


def decide_near_duplicates(
    pair_paths: list[str], sample_paths: list[str], part_ids: list[str], published: Published, s: NearSettings,
    compared: int, out_dir: str | Path,
) -> dict:  # fmt: skip
    """near_duplicates.parquet and .json, and near_dropped.parquet (the ledger piece of the samples left out:
    none unless exclude), from every bucket's pairs; returns the counts."""
    pairs = pd.concat([pd.read_parquet(p) for p in pair_paths], ignore_index=True)
    decided = decide(pairs)
    found = near_rows(decided, list(sample_paths), list(part_ids), published)
    out_dir = Path(out_dir)
    write_tables(found, out_dir, exclude=False)
    write_near_piece(decided, found, sample_paths, part_ids, s.near == "exclude", out_dir / "near_dropped.parquet")
    counts = summary(found, compared)
    atomic_write_text(out_dir / "near_duplicates.json", json.dumps({**counts, "settings": vars(s)}, indent=1) + "\n")
    return counts
