"""Near-duplicate images within the version being built and against the published versions.

Two signals: the perceptual hash of every published image (shardsmith.download.process.phash, computed where the
image is decoded: resized, recompressed, slightly cropped and mirrored copies) and, with embed.enabled and a
threshold set, the cosine similarity of the CLIP image embeddings (the same content reshot or re-edited). Pairs are
found by shardsmith.shards.nearsearch. Each group keeps one sample by a fixed rule, so a rebuild keeps the same one:

1. a sample already published (its source_id is in a published version) is always kept;
2. then the largest image (pixels before resizing);
3. then the earliest record (part order, record order within the part).

Samples are visited in that order; each one not yet taken keeps its near neighbours that are not taken yet,
so every sample left out is within the threshold of the sample it names (no chains). With `near: exclude`
those land in the ledger (stage dedupe, reason near_duplicate); with `report` they are only reported.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from shardsmith.core.atomic import atomic_open
from shardsmith.core.errors import ConfigError
from shardsmith.core.ledger import DEDUPE, EXCLUSION_COLUMNS
from shardsmith.shards.nearsearch import near_pairs

REASON = "near_duplicate"
NEAR_COLUMNS = ["key", "kept_key", "kept_version", "signal", "distance", "part", "kept_part"]
MODES = ("report", "exclude", "off")
_CHUNK = 100_000


@dataclass(frozen=True)
class NearSettings:
    """The config's `dedupe` section."""

    near: str = "report"  # report | exclude | off
    phash_max_distance: int = 8  # Hamming distance (of 64 bits) at or under which two images are near
    embedding_min_similarity: float | None = None  # cosine similarity at or over which two images are near
    bin_size: int = 20_000  # vectors searched together (shardsmith.shards.nearsearch): bounds the step's memory

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


@dataclass
class Candidates:
    """The samples compared, as arrays (about 40 bytes a sample; keys are read back only for the rows written).

    Samples of this build first, in part and record order (`part` indexes the part ids, `row` the part's
    samples table), then published samples no longer in the build (`part` -1, `row` indexes `gone_keys`).
    """

    part: np.ndarray  # int32
    row: np.ndarray  # int32
    version: np.ndarray  # int16 index into `versions`; -1: not published
    area: np.ndarray  # int64, pixels before resizing
    code: np.ndarray  # uint64 pHash
    mirror: np.ndarray  # uint64 pHash of the mirror image
    versions: list[str]
    gone_keys: list[str]
    rank: np.ndarray = None  # int64, 0 is kept first

    def __len__(self) -> int:
        return len(self.part)


def _codes(hexes: pd.Series) -> np.ndarray:
    """16-hex-digit hashes as uint64, without a Python int per hash."""
    return np.frombuffer(bytes.fromhex("".join(hexes.to_numpy(dtype=str))), dtype=">u8").astype(np.uint64)


def candidates(sample_paths: list[str], excluded: set[str], published: pd.DataFrame | None) -> Candidates:
    """Every sample of this build not already left out by another stage (read one part at a time), then the
    published samples no longer in the build, each with its place in the keep order."""
    first = published.drop_duplicates("source_id") if published is not None else None
    versions = sorted(set(first["version"])) if first is not None else []
    pub_index = pd.Index(first["source_id"]) if first is not None else pd.Index([])
    pub_version = (
        first["version"].map({v: i for i, v in enumerate(versions)}).to_numpy(np.int16)
        if first is not None
        else np.empty(0, np.int16)
    )
    present = np.zeros(len(pub_index), bool)
    gone = first.iloc[0:0] if first is not None else None
    if first is not None:  # samples of earlier versions whose source_id is no longer in the build: below
        gone = first[first["phash"].notna().to_numpy() & (first["phash"] != "").to_numpy()]  # older versions: no hash
    # filled in place, part by part: gathering the parts and concatenating them would hold every array twice
    total = sum(pq.ParquetFile(p).metadata.num_rows for p in sample_paths) + (len(gone) if gone is not None else 0)
    c = Candidates(
        part=np.empty(total, np.int32), row=np.empty(total, np.int32), version=np.empty(total, np.int16),
        area=np.empty(total, np.int64), code=np.empty(total, np.uint64), mirror=np.empty(total, np.uint64),
        versions=versions, gone_keys=[],
    )  # fmt: skip
    cols = ["key", "source_id", "width_before", "height_before", "phash", "phash_mirror"]
    left_out = pd.Index(sorted(excluded))  # hashed once, not once a part
    n = 0
    for p, path in enumerate(sample_paths):
        t = pd.read_parquet(path, columns=cols)
        keep = left_out.get_indexer(t["key"]) < 0 if len(left_out) else np.ones(len(t), bool)
        t = t[keep]
        pos = pub_index.get_indexer(t["source_id"]) if len(pub_index) else np.full(len(t), -1, np.intp)
        present[pos[pos >= 0]] = True
        at = slice(n, n + len(t))
        c.part[at], c.row[at] = p, np.flatnonzero(keep)
        c.version[at] = -1
        c.version[at][pos >= 0] = pub_version[pos[pos >= 0]]
        c.area[at] = t["width_before"].to_numpy(np.int64) * t["height_before"].to_numpy(np.int64)
        c.code[at], c.mirror[at] = _codes(t["phash"]), _codes(t["phash_mirror"])
        n += len(t)
    if gone is not None:
        gone = gone[~present[pub_index.get_indexer(gone["source_id"])]]
        at = slice(n, n + len(gone))
        c.part[at], c.row[at] = -1, np.arange(len(gone))
        c.version[at] = gone["version"].map({v: i for i, v in enumerate(versions)}).to_numpy(np.int16)
        c.area[at] = gone["width_before"].to_numpy(np.int64) * gone["height_before"].to_numpy(np.int64)
        c.code[at], c.mirror[at] = _codes(gone["phash"]), _codes(gone["phash_mirror"])
        c.gone_keys = gone["key"].tolist()
        n += len(gone)
    for name in ("part", "row", "version", "area", "code", "mirror"):  # less than total when some were left out
        setattr(c, name, getattr(c, name)[:n])
    order = np.lexsort((-c.area, c.version < 0))  # published, then largest, then earliest (lexsort is stable)
    c.rank = np.empty(n, np.int64)
    c.rank[order] = np.arange(n)
    return c


def _chunks(arrays: list[tuple[np.ndarray, np.ndarray]]):
    def gen() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for ids, x in arrays:
            for s in range(0, len(ids), _CHUNK):
                yield ids[s : s + _CHUNK], x[s : s + _CHUNK]

    return gen


def representatives(c: Candidates) -> np.ndarray:
    """For each candidate, the first in keep order with the very same hash (most often itself). Only these
    are searched: a thousand copies of one placeholder image are one search row, not half a million pairs."""
    order = np.lexsort((c.rank, c.code))
    code = c.code[order]
    start = np.r_[True, code[1:] != code[:-1]] if len(code) else np.empty(0, bool)
    rep = np.empty(len(c), np.int64)
    rep[order] = order[start][np.cumsum(start) - 1]
    return rep


def phash_pairs(c: Candidates, ids: np.ndarray, s: NearSettings, scratch: str | None = None) -> pd.DataFrame:
    """Pairs (a, b, score) of the candidates `ids` whose hashes, one of them mirrored, are within the distance."""
    every = len(ids) == len(c)  # the usual case: no copies, so views, not copies, of the hashes
    chunks = _chunks([(ids, c.code if every else c.code[ids]), (ids, c.mirror if every else c.mirror[ids])])
    a, b, d = near_pairs(chunks, 2 * len(ids), s.phash_max_distance, True, s.bin_size, scratch)
    return pd.DataFrame({"a": a, "b": b, "score": d.astype(np.float64), "signal": "phash"})


def embedding_pairs(
    c: Candidates,
    searched: np.ndarray,
    sample_paths: list[str],
    embedding_paths: list[str],
    s: NearSettings,
    scratch: str | None = None,
) -> pd.DataFrame:
    """Pairs of candidates of this build (those `searched` marks) whose CLIP image embeddings are at least the
    similarity apart.

    A part's embeddings file holds its samples table's rows in order (embed_part); the files are read as
    the search needs them, one part in memory at a time."""
    here = c.part[: int(np.count_nonzero(c.part >= 0))]  # this build's rows come first, in part order
    starts = np.searchsorted(here, np.arange(len(embedding_paths) + 1))

    def gen() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for p, path in enumerate(embedding_paths):
            lo, hi = starts[p], starts[p + 1]
            with np.load(path, allow_pickle=False) as z:
                keys, image = z["key"], z["image"]
            if not np.array_equal(keys, pd.read_parquet(sample_paths[p], columns=["key"])["key"].to_numpy(dtype=str)):
                raise ValueError(f"{path} does not hold the rows of {sample_paths[p]}: run embed_part for it again")
            rows = np.arange(lo, hi, dtype=np.int64)
            take = searched[lo:hi]
            yield rows[take], image[c.row[lo:hi][take]].astype(np.float16)

    n = int(np.count_nonzero(searched & (c.part >= 0)))
    a, b, sim = near_pairs(gen, n, s.embedding_min_similarity, False, s.bin_size, scratch)
    return pd.DataFrame({"a": a, "b": b, "score": sim.astype(np.float64), "signal": "embedding"})


def keep_one(c: Candidates, pairs: pd.DataFrame, rep: np.ndarray) -> list[tuple[int, int, str, float]]:
    """(left out, kept, signal, score) for the samples of this build left out for a kept one, in keep order
    (see the module's rule). `pairs` are between representatives; a sample with a representative's very hash
    goes where its representative goes: out for it (distance 0) when it is kept, out for its keeper when not."""
    taken: dict[int, tuple[int, str, float]] = {}
    if not pairs.empty:
        a, b = pairs["a"].to_numpy(), pairs["b"].to_numpy()
        first = c.rank[a] < c.rank[b]
        u, v = np.where(first, a, b), np.where(first, b, a)
        signal, score = pairs["signal"].to_numpy(), pairs["score"].to_numpy()
        published = c.version >= 0
        for i in np.lexsort((c.rank[v], c.rank[u])):
            keeper, other = int(u[i]), int(v[i])
            if keeper in taken or other in taken or published[other]:
                continue
            taken[other] = (keeper, str(signal[i]), float(score[i]))
    for member in np.flatnonzero((rep != np.arange(len(c))) & (c.version < 0)):
        r = int(rep[member])
        taken[int(member)] = taken.get(r, (r, "phash", 0.0))
    return sorted(((o, *t) for o, t in taken.items()), key=lambda t: c.rank[t[0]])


def _keys(c: Candidates, ids: list[int], sample_paths: list[str]) -> dict[int, str]:
    """The keys of some candidates, read back from their parts' samples tables."""
    out: dict[int, str] = {}
    by_part: dict[int, list[int]] = {}
    for i in ids:
        if c.part[i] < 0:
            out[i] = c.gone_keys[c.row[i]]
        else:
            by_part.setdefault(int(c.part[i]), []).append(i)
    for p, members in by_part.items():
        keys = pd.read_parquet(sample_paths[p], columns=["key"])["key"].to_numpy()
        out.update({i: str(keys[c.row[i]]) for i in members})
    return out


def find_near_duplicates(
    sample_paths: list[str],
    part_ids: list[str],
    s: NearSettings,
    excluded: set[str] = frozenset(),
    published: pd.DataFrame | None = None,
    embedding_paths: list[str] = (),
    scratch: str | None = None,
) -> tuple[pd.DataFrame, int]:
    """NEAR_COLUMNS rows for the samples of this build that are near-duplicates of a kept sample, and how many
    samples of this build were compared."""
    c = candidates(list(sample_paths), set(excluded), published)
    rep = representatives(c)
    searched = rep == np.arange(len(c))
    pairs = [phash_pairs(c, np.flatnonzero(searched), s, scratch)]
    if s.embedding_min_similarity is not None and embedding_paths:
        pairs.append(embedding_pairs(c, searched, list(sample_paths), list(embedding_paths), s, scratch))
    both = pd.concat(pairs, ignore_index=True)
    both = both[(c.version[both["a"]] < 0) | (c.version[both["b"]] < 0)]  # published pairs: both stay
    both = both.drop_duplicates(["a", "b"]).reset_index(drop=True)  # the perceptual signal first: its pair is named
    decided = keep_one(c, both, rep)
    keys = _keys(c, sorted({i for o, k, *_ in decided for i in (o, k)}), list(sample_paths))
    part = lambda i: part_ids[c.part[i]] if c.part[i] >= 0 else ""  # noqa: E731
    version = lambda i: c.versions[c.version[i]] if c.version[i] >= 0 else ""  # noqa: E731
    rows = [[keys[o], keys[k], version(k), sig, score, part(o), part(k)] for o, k, sig, score in decided]
    return pd.DataFrame(rows, columns=NEAR_COLUMNS), int(np.count_nonzero(c.part >= 0))


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
