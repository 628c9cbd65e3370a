"""Index files next to the shards: sizes.json, the wids index, manifest.parquet, rejected.parquet, stats.json.

The ledger must add up: every input record is either a published sample or a rejection row, and this
module refuses to write an index where it does not.
"""

import json
import os
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from shardsmith.core.atomic import atomic_write_text
from shardsmith.core.ledger import REJECT_COLUMNS
from shardsmith.formats.tables import ParquetAppender, num_rows

MANIFEST_COLUMNS = [
    "key", "shard", "source_id", "source", "url", "width_before", "height_before", "width", "height",
    "bytes", "sha256", "caption_length", "phash", "phash_mirror",
]  # fmt: skip

# The index files by role: their names, the workflow's outputs (rules/shards.smk: index_shards) and what
# build_index writes.
INDEX_FILES = {
    "sizes": "sizes.json",
    "wids": "wids-index.json",
    "manifest": "manifest.parquet",
    "rejected": "rejected.parquet",
    "stats": "stats.json",
}


class LedgerMismatch(RuntimeError):
    pass


def dumps(obj: object) -> str:
    return json.dumps(obj, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def _counts(table: pa.Table, columns: list[str]) -> Counter:
    """Rows per distinct value (a tuple of values for several columns)."""
    groups = table.select(columns).group_by(columns).aggregate([([], "count_all")]).to_pydict()
    values = zip(*(groups[c] for c in columns), strict=True)
    return Counter({(v if len(columns) > 1 else v[0]): n for v, n in zip(values, groups["count_all"], strict=True)})


def rejected_by_source(rejected_path: str | os.PathLike) -> dict[str, int]:
    """Rejections per source, from a ledger (for a stats.json written before it counted them)."""
    return dict(sorted(_counts(pq.ParquetFile(rejected_path).read(columns=["source"]), ["source"]).items()))


def wids_index(dataset: str, infos: list[dict]) -> dict:
    """wids' shard index (wids-shard-index-v1): url, nsamples, md5sum and filesize of every shard."""
    return {
        "__kind__": "wids-shard-index-v1",
        "wids_version": 1,
        "name": dataset,
        "shardlist": [
            {k: i[k] for k in ("url", "nsamples", "md5sum", "filesize")}
            for i in ({**i, "url": i["shard"]} for i in infos)
        ],
    }


def build_index(
    dataset: str,
    shard_infos: list[str],
    shard_plans: list[str],
    status_paths: list[str],
    rejected_paths: list[str],
    out_dir: str | os.PathLike,
) -> dict:
    """Write the index files into out_dir; returns the stats. Raises LedgerMismatch if counts do not add up.

    Streamed: the manifest and the ledger are written one shard plan or ledger table at a time (in shard
    and part order), so memory does not grow with the dataset; the counts are summed on the way.
    """
    out_dir = Path(out_dir)
    infos = [json.loads(Path(p).read_text()) for p in shard_infos]
    sizes = {i["shard"]: i["nsamples"] for i in infos}
    inputs = sum(num_rows(p) for p in status_paths)
    by_source: Counter = Counter()
    by_source_rejected: Counter = Counter()
    by_stage: Counter = Counter()
    by_reason: Counter = Counter()
    passthrough = 0
    out_dir.mkdir(parents=True, exist_ok=True)
    with (
        ParquetAppender(out_dir / INDEX_FILES["manifest"], MANIFEST_COLUMNS) as manifest,
        ParquetAppender(out_dir / INDEX_FILES["rejected"], REJECT_COLUMNS) as rejected,
    ):
        for path in shard_plans:  # in Arrow: counted by group_by, not row by row in Python
            plan = pq.ParquetFile(path).read(columns=[c for c in MANIFEST_COLUMNS if c != "shard"] + ["passthrough"])
            shard = pa.array([Path(path).name.split(".")[0] + ".tar"] * plan.num_rows, pa.string())
            manifest.append(plan.append_column("shard", shard).select(MANIFEST_COLUMNS))
            by_source.update(_counts(plan, ["source"]))
            passthrough += int(pc.sum(plan.column("passthrough").cast(pa.int64())).as_py() or 0)
        for path in rejected_paths:
            table = pq.ParquetFile(path).read(columns=REJECT_COLUMNS)
            rejected.append(table)
            for (source, stage, reason), n in _counts(table, ["source", "stage", "reason"]).items():
                by_source_rejected[source] += n
                by_stage[stage] += n
                by_reason[f"{stage}/{reason}"] += n
        published = int(sum(sizes.values()))
        if published != manifest.rows:
            raise LedgerMismatch(f"shards hold {published} samples but the shard plans list {manifest.rows}")
        if inputs != published + rejected.rows:
            raise LedgerMismatch(
                f"ledger does not add up: {inputs} input records != {published} published + {rejected.rows} rejected"
            )
    stats = {
        "dataset": dataset,
        "input_records": inputs,
        "published": published,
        "rejected": rejected.rows,
        "shards": len(infos),
        "bytes": int(sum(i["filesize"] for i in infos)),
        "rejected_by_stage": dict(sorted(by_stage.items())),
        "rejected_by_reason": dict(sorted(by_reason.items())),
        "published_by_source": {k: int(v) for k, v in sorted(by_source.items())},
        "rejected_by_source": dict(sorted(by_source_rejected.items())),
        "passed_through_unchanged": passthrough,
    }
    atomic_write_text(out_dir / INDEX_FILES["sizes"], dumps(sizes))
    atomic_write_text(out_dir / INDEX_FILES["wids"], dumps(wids_index(dataset, infos)))
    atomic_write_text(out_dir / INDEX_FILES["stats"], dumps(stats))
    return stats
