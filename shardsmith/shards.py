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

import pandas as pd

from shardsmith.process import REJECT_COLUMNS, SAMPLE_COLUMNS
from shardsmith.tario import ShardWriter, atomic_open, atomic_write_text, read_at

STAGE = "shard"


def shard_name(dataset: str, index: int) -> str:
    return f"{dataset}-{index:06d}"


def _ledger_rows(samples: pd.DataFrame, stage: object, reason: object, detail: object) -> pd.DataFrame:
    """Rejection rows for samples that were processed but are left out of the shards."""
    rows = samples[["source", "source_id", "url", "key"]].reset_index(drop=True)
    return rows.assign(stage=stage, reason=reason, detail=detail)[REJECT_COLUMNS]


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
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    frames = [pd.read_parquet(path).assign(part=part) for part, path in zip(part_ids, samples_paths, strict=True)]
    samples = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=[*SAMPLE_COLUMNS, "part"])
    dropped = [pd.DataFrame(columns=REJECT_COLUMNS)]

    if exclusions:
        excluded = pd.concat([pd.read_parquet(p) for p in exclusions], ignore_index=True)
        excluded = excluded.drop_duplicates("key", keep="first").set_index("key")
        hit = samples["key"].isin(excluded.index)
        why = excluded.loc[samples.loc[hit, "key"]]
        dropped.append(_ledger_rows(samples[hit], why["stage"].values, why["reason"].values, why["detail"].values))
        samples = samples[~hit].reset_index(drop=True)

    is_dup = samples.duplicated("key", keep="first")
    if is_dup.any():
        first = samples[~is_dup].set_index("key")["source_id"]
        detail = ["same key as " + first[k] for k in samples.loc[is_dup, "key"]]
        dropped.append(_ledger_rows(samples[is_dup], STAGE, "duplicate_key", detail))
        samples = samples[~is_dup].reset_index(drop=True)

    with atomic_open(out_dir / "dropped.parquet") as f:
        pd.concat(dropped, ignore_index=True).to_parquet(f, index=False)
    names = []
    for i, start in enumerate(range(0, len(samples), samples_per_shard)):
        name = shard_name(dataset, i)
        chunk = samples.iloc[start : start + samples_per_shard]
        with atomic_open(out_dir / f"{name}.samples.parquet") as f:
            chunk.to_parquet(f, index=False)
        atomic_write_text(out_dir / f"{name}.parts", "".join(f"{p}\n" for p in dict.fromkeys(chunk["part"])))
        names.append(name)
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
