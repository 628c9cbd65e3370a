"""Shards: assign samples to uniform shards, then write each shard from the processed parts.

Samples keep the order of the parts and of the records within them, so the same inputs always give the
same shards. A key seen before anywhere in the dataset is rejected as a duplicate (the first one wins).
Every shard holds `samples_per_shard` samples except the last.
"""

import contextlib
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from shardsmith.process import REJECT_COLUMNS
from shardsmith.tables import ParquetAppender, dataset_key_hashes, key_hashes, repeated
from shardsmith.tario import ShardWriter, atomic_open, atomic_write_text, read_at

STAGE = "shard"


def shard_name(dataset: str, index: int) -> str:
    return f"{dataset}-{index:06d}"


def _ledger_rows(samples: pd.DataFrame, stage: object, reason: object, detail: object) -> pd.DataFrame:
    """Rejection rows for samples that were processed but are left out of the shards."""
    rows = samples[["source", "source_id", "url", "key"]].reset_index(drop=True)
    return rows.assign(stage=stage, reason=reason, detail=detail)[REJECT_COLUMNS]


class _Exclusions:
    """Exclusion tables looked up by key hash; their rows stay in Arrow (no Python object per row)."""

    def __init__(self, paths: list[str]) -> None:
        tables = [pq.read_table(p, columns=["key", "stage", "reason", "detail"]) for p in paths]
        self.table = pa.concat_tables([t.cast(tables[0].schema) for t in tables]) if tables else None
        n = 0 if self.table is None else self.table.num_rows
        hashes = key_hashes(self.table.column("key").to_numpy(zero_copy_only=False)) if n else np.empty(0, np.uint64)
        self.order = np.argsort(hashes, kind="stable")  # equal keys: the first table row first (the one that counts)
        self.sorted = hashes[self.order]

    def find(self, keys: pd.Series, hashes: np.ndarray) -> tuple[np.ndarray, pd.DataFrame]:
        """(mask of the excluded keys, their stage/reason/detail rows in the same order)."""
        if not len(self.sorted) or not len(keys):
            return np.zeros(len(keys), dtype=bool), pd.DataFrame(columns=["stage", "reason", "detail"])
        at = np.searchsorted(self.sorted, hashes)
        candidate = np.flatnonzero((at < len(self.sorted)) & (self.sorted[np.minimum(at, len(self.sorted) - 1)] == hashes))
        key_col = self.table.column("key")
        hit, rows = [], []
        for i in candidate:  # walk the run of equal hashes: a different key with the same hash is not a hit
            j = at[i]
            while j < len(self.sorted) and self.sorted[j] == hashes[i]:
                row = int(self.order[j])
                if key_col[row].as_py() == keys.iat[i]:
                    hit.append(i)
                    rows.append(row)
                    break
                j += 1
        mask = np.zeros(len(keys), dtype=bool)
        mask[hit] = True
        why = self.table.select(["stage", "reason", "detail"]).take(pa.array(rows, pa.int64())).to_pandas()
        return mask, why


def plan_shards(
    samples_paths: list[str],
    part_ids: list[str],
    dataset: str,
    samples_per_shard: int,
    out_dir: str | os.PathLike,
    exclusions: list[str] = (),
) -> list[str]:
    """Write `{name}.samples.parquet` + `{name}.parts` per shard and `dropped.parquet`; returns shard names.

    `exclusions` are parquet tables (key, stage, reason, detail) from stages that drop samples after
    processing (e.g. a similarity threshold, records already published); their samples go to the ledger
    with that reason, and the shards stay uniform.

    Streamed: one part's rows and one shard's plan are held, plus 8 bytes per sample (the key hashes that
    find repeated keys) and the exclusion tables in Arrow.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    hashes = dataset_key_hashes(list(samples_paths))
    maybe_repeated = repeated(hashes)  # positions whose key hash occurs twice or more: usually none
    excluded = _Exclusions(list(exclusions))
    first_seen: dict[str, str] = {}  # key -> source_id, for the keys in maybe_repeated only
    names: list[str] = []
    pending: list[pd.DataFrame] = []
    held = 0

    def flush(final: bool) -> None:
        """Write every full shard held (and, when final, the remainder); keep the rest."""
        nonlocal pending, held
        if held < samples_per_shard and not (final and held):
            return
        rows, at = pd.concat(pending, ignore_index=True), 0
        while len(rows) - at >= samples_per_shard or (final and at < len(rows)):
            chunk = rows.iloc[at : at + samples_per_shard]
            at += len(chunk)
            name = shard_name(dataset, len(names))
            with atomic_open(out_dir / f"{name}.samples.parquet") as f:
                chunk.to_parquet(f, index=False)
            atomic_write_text(out_dir / f"{name}.parts", "".join(f"{p}\n" for p in dict.fromkeys(chunk["part"])))
            names.append(name)
        pending, held = [rows.iloc[at:]], len(rows) - at

    start = 0
    with ParquetAppender(out_dir / "dropped.parquet", pd.DataFrame(columns=REJECT_COLUMNS)) as dropped:
        for part, path in zip(part_ids, samples_paths, strict=True):
            samples = pd.read_parquet(path).assign(part=part)
            h = hashes[start : start + len(samples)]
            lo, hi = np.searchsorted(maybe_repeated, [start, start + len(samples)])
            local = maybe_repeated[lo:hi] - start
            start += len(samples)

            hit, why = excluded.find(samples["key"], h)
            stage, reason, detail = (np.full(len(samples), None, dtype=object) for _ in range(3))
            stage[hit], reason[hit], detail[hit] = why["stage"].values, why["reason"].values, why["detail"].values
            is_dup = np.zeros(len(samples), dtype=bool)
            for i in local:
                if hit[i]:
                    continue
                key, sid = samples["key"].iat[i], samples["source_id"].iat[i]
                if key in first_seen:
                    is_dup[i] = True
                    stage[i], reason[i], detail[i] = STAGE, "duplicate_key", "same key as " + first_seen[key]
                else:
                    first_seen[key] = sid
            out = hit | is_dup
            if out.any():  # in record order
                dropped.append(_ledger_rows(samples[out], stage[out], reason[out], detail[out]))
            keep = samples[~out]
            if len(keep):
                pending.append(keep)
                held += len(keep)
            flush(final=False)
        flush(final=True)
    return names


def write_shard(plan_path: str, part_tars: dict[str, str], out_tar: str, out_info: str) -> dict:
    """Copy the planned samples' members from the processed part tars into one deterministic shard."""
    plan = pd.read_parquet(plan_path)
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(atomic_open(out_tar))
        tar = stack.enter_context(ShardWriter(out))
        needed = set(plan["part"])
        sources = {part: stack.enter_context(open(path, "rb")) for part, path in part_tars.items() if part in needed}
        for row in plan.to_dict("records"):
            src = sources[row["part"]]
            members = {ext: read_at(src, row[f"{ext}_offset"], row[f"{ext}_size"]) for ext in ("jpg", "txt", "json")}
            tar.write(row["key"], members)
    md5, sha = hashlib.md5(), hashlib.sha256()
    with open(out_tar, "rb") as f:
        while block := f.read(1 << 20):
            md5.update(block)
            sha.update(block)
    info = {
        "shard": os.path.basename(out_tar),
        "nsamples": len(plan),
        "filesize": os.path.getsize(out_tar),
        "md5sum": md5.hexdigest(),
        "sha256": sha.hexdigest(),
    }
    atomic_write_text(out_info, json.dumps(info, indent=1, sort_keys=True) + "\n")
    return info
