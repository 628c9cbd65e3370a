"""Index files next to the shards: sizes.json, the wids index, manifest.parquet/, rejected.parquet/, stats.json.

All are made from pieces the jobs that held the rows wrote, so the index job's work grows with shards and
parts, never with samples. The manifest and the ledger are folders of parquet files (a table in pieces, as
Spark and Dask write `x.parquet/`; pandas, pyarrow, DuckDB and polars read the folder as one table): one
file per shard (write_manifest_piece, in write_shard), one per ledger piece (a part's rejections, a planning
group's drops), hard-linked into place. A single file would cost one job a pass over every row: ~1.6 h,
and a file of hundreds of GB, at LAION-5B. sizes.json, the wids index and stats.json are JSON, one entry
or count per shard and per reason: they are written from the shards' info files.

The ledger must add up: every input record is either a published sample or a rejection row, and this
module refuses to write an index where it does not.
"""

import json
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from shardsmith.core.atomic import atomic_open, atomic_write_text
from shardsmith.core.ledger import REJECT_COLUMNS
from shardsmith.formats.tables import assemble_folder, num_rows, table_files

MANIFEST_COLUMNS = [
    "key", "shard", "source_id", "source", "url", "width_before", "height_before", "width", "height",
    "bytes", "sha256", "caption_length", "phash", "phash_mirror", "language", "language_score", "blurred",
]  # fmt: skip
_INTS = {"width_before", "height_before", "width", "height", "bytes", "caption_length", "blurred"}
_FLOATS = {"language_score"}
MANIFEST_SCHEMA = pa.schema(
    [(c, pa.int64() if c in _INTS else pa.float64() if c in _FLOATS else pa.string()) for c in MANIFEST_COLUMNS]
)
REJECT_SCHEMA = pa.schema([(c, pa.string()) for c in REJECT_COLUMNS])

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
    counts: Counter = Counter()
    for f in table_files(rejected_path):
        counts.update(_counts(pq.ParquetFile(f).read(columns=["source"]), ["source"]))
    return dict(sorted(counts.items()))


def write_manifest_piece(plan: pa.Table, shard: str, path: str | os.PathLike) -> dict:
    """A shard's rows of the manifest, from its plan; returns what stats.json counts of them (samples per
    source, images passed through unchanged), for the shard's info file.

    Built from buffers and counted in Python (a shard is small): pa.array() and Arrow's group_by import
    pandas, ~0.3 s more for each write_shard job."""
    n, name = plan.num_rows, shard.encode()
    offsets = pa.py_buffer((np.arange(n + 1, dtype=np.int32) * len(name)).tobytes())
    column = pa.Array.from_buffers(pa.string(), n, [None, offsets, pa.py_buffer(name * n)])
    piece = plan.replace_schema_metadata(None).append_column("shard", column).select(MANIFEST_COLUMNS)
    with atomic_open(path) as f:
        pq.write_table(piece.cast(MANIFEST_SCHEMA), f)
    by_source = Counter(plan.column("source").to_pylist())
    passthrough = sum(map(bool, plan.column("passthrough").to_pylist()))
    blurred = sum(1 for n in plan.column("blurred").to_pylist() if n)
    return {"published_by_source": dict(sorted(by_source.items())), "passthrough": passthrough, "blurred": blurred}


def write_scored_manifest_piece(piece: str | os.PathLike, scores: str | os.PathLike, path: str | os.PathLike) -> int:
    """A shard's manifest piece with its score table's columns (CLIP similarity, norms, score heads) after the
    manifest's, as float32 in the score table's order of columns, matched by key (a sample without a score row
    gets nulls); returns the rows."""
    table = pq.read_table(piece)
    scored = pq.read_table(scores)
    columns = [c for c in scored.column_names if c != "key"]
    clash = sorted(set(columns) & set(table.column_names))
    if clash:
        raise ValueError(f"{scores}: score columns {clash} are manifest columns already")
    keys = scored.column("key").to_pylist()
    at = dict(zip(keys, range(len(keys)), strict=True))
    rows = pa.array([at.get(k) for k in table.column("key").to_pylist()], pa.int64())
    for c in columns:
        table = table.append_column(pa.field(c, pa.float32()), scored.column(c).cast(pa.float32()).take(rows))
    with atomic_open(path) as f:
        pq.write_table(table.replace_schema_metadata(None), f)
    return table.num_rows


def manifest_schema(pieces: list[str]) -> pa.Schema:
    """The manifest's columns: MANIFEST_SCHEMA's, then any score columns the first piece adds (scored pieces:
    write_scored_manifest_piece), as float32."""
    if not pieces:
        return MANIFEST_SCHEMA
    extra = [n for n in pq.read_schema(pieces[0]).names if n not in MANIFEST_COLUMNS]
    return pa.schema([*MANIFEST_SCHEMA, *(pa.field(n, pa.float32()) for n in extra)])


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
    manifest_pieces: list[str],
    status_paths: list[str],
    rejected_paths: list[str],
    out_dir: str | os.PathLike,
) -> dict:
    """Write the index files into out_dir; returns the stats. Raises LedgerMismatch if counts do not add up.

    `manifest_pieces`: each shard's (write_manifest_piece, or write_scored_manifest_piece with embeddings), in
    shard order; `rejected_paths`: the ledger's
    pieces in ledger order (the parts', then planning's). Rows are counted from the pieces' footers; only the
    ledger's source, stage and reason columns are read, for its counts by reason.
    """
    out_dir = Path(out_dir)
    infos = [json.loads(Path(p).read_text()) for p in shard_infos]
    sizes = {i["shard"]: i["nsamples"] for i in infos}
    inputs = sum(num_rows(p) for p in status_paths)
    by_source: Counter = Counter()
    by_source_rejected: Counter = Counter()
    by_stage: Counter = Counter()
    by_reason: Counter = Counter()
    for i in infos:
        by_source.update(i["published_by_source"])
    for path in rejected_paths:  # in Arrow: counted by group_by, not row by row in Python
        for (source, stage, reason), n in _counts(
            pq.read_table(path, columns=["source", "stage", "reason"]), ["source", "stage", "reason"]
        ).items():
            by_source_rejected[source] += n
            by_stage[stage] += n
            by_reason[f"{stage}/{reason}"] += n
    published = int(sum(sizes.values()))
    listed = sum(num_rows(p) for p in manifest_pieces)
    if published != listed:
        raise LedgerMismatch(f"shards hold {published} samples but the shard plans list {listed}")
    ledger_rows = {p: num_rows(p) for p in rejected_paths}  # footers read once
    rejected = sum(ledger_rows.values())
    if inputs != published + rejected:
        raise LedgerMismatch(
            f"ledger does not add up: {inputs} input records != {published} published + {rejected} rejected"
        )
    manifest = [(Path(i["shard"]).with_suffix(".parquet").name, p) for i, p in zip(infos, manifest_pieces, strict=True)]
    assemble_folder(manifest, out_dir / INDEX_FILES["manifest"], manifest_schema(manifest_pieces))
    # pieces without rows are left out (one kept when all are empty, for the columns): the ledger's files do
    # not depend on which steps ran with nothing to reject
    kept = [p for p in rejected_paths if ledger_rows[p]] or rejected_paths[:1]
    ledger = [(f"{n:06d}.parquet", p) for n, p in enumerate(kept)]
    assemble_folder(ledger, out_dir / INDEX_FILES["rejected"], REJECT_SCHEMA)
    stats = {
        "dataset": dataset,
        "input_records": inputs,
        "published": published,
        "rejected": rejected,
        "shards": len(infos),
        "bytes": int(sum(i["filesize"] for i in infos)),
        "rejected_by_stage": dict(sorted(by_stage.items())),
        "rejected_by_reason": dict(sorted(by_reason.items())),
        "published_by_source": {k: int(v) for k, v in sorted(by_source.items())},
        "rejected_by_source": dict(sorted(by_source_rejected.items())),
        "passed_through_unchanged": sum(i["passthrough"] for i in infos),
        "blurred_images": sum(i.get("blurred", 0) for i in infos),
    }
    atomic_write_text(out_dir / INDEX_FILES["sizes"], dumps(sizes))
    atomic_write_text(out_dir / INDEX_FILES["wids"], dumps(wids_index(dataset, infos)))
    atomic_write_text(out_dir / INDEX_FILES["stats"], dumps(stats))
    return stats
