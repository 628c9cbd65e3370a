"""Near-duplicate images within the version being built and against the published versions.

Two signals: the perceptual hash of every published image (shardsmith.phash, computed where the image is
decoded: resized, recompressed, slightly cropped and mirrored copies) and, with embed.enabled and a threshold
set, the cosine similarity of the CLIP image embeddings (the same content reshot or re-edited). Pairs are found
by shardsmith.nearsearch. Each group keeps one sample by a fixed rule, so a rebuild keeps the same one:

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

from shardsmith.errors import ConfigError
from shardsmith.nearsearch import near_pairs

STAGE = "dedupe"
REASON = "near_duplicate"
NEAR_COLUMNS = ["key", "kept_key", "kept_version", "signal", "distance", "part", "kept_part"]
EXCLUSION_COLUMNS = ["key", "stage", "reason", "detail"]
MODES = ("report", "exclude", "off")
_CHUNK = 100_000


@dataclass(frozen=True)
class NearSettings:
    """The config's `dedupe` section."""

    near: str = "report"  # report | exclude | off
    phash_max_distance: int = 8  # Hamming distance (of 64 bits) at or under which two images are near
    embedding_min_similarity: float | None = None  # cosine similarity at or over which two images are near
    bin_size: int = 20_000  # vectors searched together (shardsmith.nearsearch): bounds the step's memory

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
    pub_version = first["version"].map({v: i for i, v in enumerate(versions)}).to_numpy(np.int16) if first is not None else np.empty(0, np.int16)
    present = np.zeros(len(pub_index), bool)
    cols = ["key", "source_id", "width_before", "height_before", "phash", "phash_mirror"]
    parts: list[tuple] = []
    for p, path in enumerate(sample_paths):
        t = pd.read_parquet(path, columns=cols)
        keep = ~t["key"].isin(excluded).to_numpy() if excluded else np.ones(len(t), bool)
        t = t[keep]
        pos = pub_index.get_indexer(t["source_id"]) if len(pub_index) else np.full(len(t), -1, np.intp)
        present[pos[pos >= 0]] = True
        version = np.full(len(t), -1, np.int16)
        version[pos >= 0] = pub_version[pos[pos >= 0]]
        area = t["width_before"].to_numpy(np.int64) * t["height_before"].to_numpy(np.int64)
        rows = np.flatnonzero(keep).astype(np.int32)
        parts.append((np.full(len(t), p, np.int32), rows, version, area, _codes(t["phash"]), _codes(t["phash_mirror"])))
    gone_keys: list[str] = []
    if first is not None:
        gone = first[~present & first["phash"].notna().to_numpy() & (first["phash"] != "").to_numpy()]  # older versions have no hash
        n = len(gone)
        area = gone["width_before"].to_numpy(np.int64) * gone["height_before"].to_numpy(np.int64)
        version = gone["version"].map({v: i for i, v in enumerate(versions)}).to_numpy(np.int16)
        parts.append((np.full(n, -1, np.int32), np.arange(n, dtype=np.int32), version, area, _codes(gone["phash"]), _codes(gone["phash_mirror"])))
        gone_keys = gone["key"].tolist()
    empty = (np.empty(0, np.int32), np.empty(0, np.int32), np.empty(0, np.int16), np.empty(0, np.int64), np.empty(0, np.uint64), np.empty(0, np.uint64))
    arrays = [np.concatenate([x[i] for x in parts]) if parts else empty[i] for i in range(6)]
    c = Candidates(*arrays, versions=versions, gone_keys=gone_keys)
    order = np.lexsort((np.arange(len(c)), -c.area, c.version < 0))  # published, then largest, then earliest
    c.rank = np.empty(len(c), np.int64)
    c.rank[order] = np.arange(len(c))
    return c


def _chunks(arrays: list[tuple[np.ndarray, np.ndarray]]):
    def gen() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for ids, x in arrays:
            for s in range(0, len(ids), _CHUNK):
                yield ids[s : s + _CHUNK], x[s : s + _CHUNK]

    return gen


def phash_pairs(c: Candidates, s: NearSettings, scratch: str | None = None) -> pd.DataFrame:
    """Pairs (a, b, score) of candidates whose hashes, one of them mirrored, are within the distance."""
    ids = np.arange(len(c), dtype=np.int64)
    a, b, d = near_pairs(_chunks([(ids, c.code), (ids, c.mirror)]), 2 * len(c), s.phash_max_distance, True, s.bin_size, scratch)
    return pd.DataFrame({"a": a, "b": b, "score": d.astype(np.float64), "signal": "phash"})


def embedding_pairs(
    c: Candidates, sample_paths: list[str], embedding_paths: list[str], s: NearSettings, scratch: str | None = None
) -> pd.DataFrame:
    """Pairs of candidates of this build whose CLIP image embeddings are at least the similarity apart.

    A part's embeddings file holds its samples table's rows in order (embed_part); the files are read as
    the search needs them, one part in memory at a time."""
    starts = np.searchsorted(c.part, np.arange(len(embedding_paths) + 1)) if len(c) else np.zeros(len(embedding_paths) + 1, int)

    def gen() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for p, path in enumerate(embedding_paths):
            lo, hi = starts[p], starts[p + 1]
            with np.load(path, allow_pickle=False) as z:
                keys, image = z["key"], z["image"]
            if not np.array_equal(keys, pd.read_parquet(sample_paths[p], columns=["key"])["key"].to_numpy(dtype=str)):
                raise ValueError(f"{path} does not hold the rows of {sample_paths[p]}: run embed_part for it again")
            yield np.arange(lo, hi, dtype=np.int64), image[c.row[lo:hi]].astype(np.float16)

    n = int(np.count_nonzero(c.part >= 0))
    a, b, sim = near_pairs(gen, n, s.embedding_min_similarity, False, s.bin_size, scratch)
    return pd.DataFrame({"a": a, "b": b, "score": sim.astype(np.float64), "signal": "embedding"})


def keep_one(c: Candidates, pairs: pd.DataFrame) -> list[tuple[int, int, int]]:
    """(left out, kept, pair index) for the samples of this build left out for a kept one, in keep order."""
    if pairs.empty:
        return []
    a, b = pairs["a"].to_numpy(), pairs["b"].to_numpy()
    first = c.rank[a] < c.rank[b]
    u, v = np.where(first, a, b), np.where(first, b, a)
    order = np.lexsort((c.rank[v], c.rank[u]))
    published = c.version >= 0
    taken = np.zeros(len(c), bool)  # left out for a kept sample
    out = []
    for i in order:
        keeper, other = u[i], v[i]
        if taken[keeper] or taken[other] or published[other]:
            continue
        taken[other] = True
        out.append((int(other), int(keeper), int(i)))
    return sorted(out, key=lambda t: c.rank[t[0]])


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
    pairs = [phash_pairs(c, s, scratch)]
    if s.embedding_min_similarity is not None and embedding_paths:
        pairs.append(embedding_pairs(c, list(sample_paths), list(embedding_paths), s, scratch))
    both = pd.concat(pairs, ignore_index=True)
    both = both[(c.version[both["a"]] < 0) | (c.version[both["b"]] < 0)]  # published pairs: both stay
    both = both.drop_duplicates(["a", "b"]).reset_index(drop=True)  # the perceptual signal first: its pair is named
    decided = keep_one(c, both)
    keys = _keys(c, sorted({i for o, k, _ in decided for i in (o, k)}), list(sample_paths))
    part = lambda i: part_ids[c.part[i]] if c.part[i] >= 0 else ""  # noqa: E731
    version = lambda i: c.versions[c.version[i]] if c.version[i] >= 0 else ""  # noqa: E731
    signal, score = both["signal"].to_numpy(), both["score"].to_numpy()
    rows = [[keys[o], keys[k], version(k), signal[i], score[i], part(o), part(k)] for o, k, i in decided]
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
    rows = [[r["key"], STAGE, REASON, describe(r)] for r in near.to_dict("records")]
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
    from shardsmith.tario import atomic_open

    out_dir = Path(out_dir)
    with atomic_open(out_dir / "near_duplicates.parquet") as f:
        near.to_parquet(f, index=False)
    if not exclude:
        return []
    with atomic_open(out_dir / "near_exclusions.parquet") as f:
        exclusions(near).to_parquet(f, index=False)
    return [str(out_dir / "near_exclusions.parquet")]
