"""Index files next to the shards: sizes.json, the wids index, manifest.parquet, rejected.parquet, stats.json.

The ledger must add up: every input record is either a published sample or a rejection row, and this
module refuses to write an index where it does not.
"""

import json
import os
from collections import Counter
from pathlib import Path

import pandas as pd

from shardsmith.process import REJECT_COLUMNS
from shardsmith.tario import atomic_open, atomic_write_text

MANIFEST_COLUMNS = [
    "key", "shard", "source_id", "source", "url", "width_before", "height_before", "width", "height",
    "bytes", "sha256", "caption_length",
]  # fmt: skip


class LedgerMismatch(RuntimeError):
    pass


def dumps(obj: object) -> str:
    return json.dumps(obj, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def build_index(
    dataset: str,
    shard_infos: list[str],
    shard_plans: list[str],
    status_paths: list[str],
    rejected_paths: list[str],
    out_dir: str | os.PathLike,
) -> dict:
    """Write the index files into out_dir; returns the stats. Raises LedgerMismatch if counts do not add up."""
    out_dir = Path(out_dir)
    infos = [json.loads(Path(p).read_text()) for p in shard_infos]
    sizes = {i["shard"]: i["nsamples"] for i in infos}
    wids = {
        "__kind__": "wids-shard-index-v1",
        "wids_version": 1,
        "name": dataset,
        "shardlist": [{k: i[k] for k in ("url", "nsamples", "md5sum", "filesize")} for i in ({**i, "url": i["shard"]} for i in infos)],
    }
    plans = [pd.read_parquet(p).assign(shard=Path(p).name.split(".")[0] + ".tar") for p in shard_plans]
    plan = pd.concat(plans, ignore_index=True) if plans else pd.DataFrame(columns=[*MANIFEST_COLUMNS, "passthrough"])
    manifest = plan[MANIFEST_COLUMNS]
    rejected = pd.concat([pd.read_parquet(p) for p in rejected_paths], ignore_index=True)[REJECT_COLUMNS]
    inputs = sum(len(pd.read_parquet(p, columns=["rid"])) for p in status_paths)

    published = int(sum(sizes.values()))
    if published != len(manifest):
        raise LedgerMismatch(f"shards hold {published} samples but the shard plans list {len(manifest)}")
    if inputs != published + len(rejected):
        raise LedgerMismatch(
            f"ledger does not add up: {inputs} input records != {published} published + {len(rejected)} rejected"
        )
    by_stage = Counter(rejected["stage"])
    by_reason = Counter(f"{s}/{r}" for s, r in zip(rejected["stage"], rejected["reason"]))
    stats = {
        "dataset": dataset,
        "input_records": inputs,
        "published": published,
        "rejected": len(rejected),
        "shards": len(infos),
        "bytes": int(sum(i["filesize"] for i in infos)),
        "rejected_by_stage": dict(sorted(by_stage.items())),
        "rejected_by_reason": dict(sorted(by_reason.items())),
        "published_by_source": {k: int(v) for k, v in sorted(Counter(manifest["source"]).items())},
        "passed_through_unchanged": int(plan["passthrough"].astype(bool).sum()),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / "sizes.json", dumps(sizes))
    atomic_write_text(out_dir / "wids-index.json", dumps(wids))
    atomic_write_text(out_dir / "stats.json", dumps(stats))
    with atomic_open(out_dir / "manifest.parquet") as f:
        manifest.to_parquet(f, index=False)
    with atomic_open(out_dir / "rejected.parquet") as f:
        rejected.sort_values(["source", "source_id"], kind="stable").to_parquet(f, index=False)
    return stats
