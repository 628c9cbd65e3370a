"""The shuffle between planning's map and reduce jobs: a table cut by bucket, as an Arrow IPC file with one
record batch per bucket, in bucket order, empty ones too; the job of bucket i reads batch i of every map job's
file and nothing else (memory-mapped). The same file carries what a reduce job sends back to each group, and
what a decision partition sends to each other partition: a "bucket" here is whichever unit reads the batch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable

import numpy as np
import pyarrow as pa

from shardsmith.core.atomic import atomic_open


def cut(table: pa.Table, index: np.ndarray, n: int) -> list[pa.Table]:
    """The rows of `table` for each of `n` buckets, by each row's bucket index (rows keep their order)."""
    index = np.asarray(index, np.int64)
    order = np.argsort(index, kind="stable")
    starts = np.searchsorted(index[order], np.arange(n + 1))
    table = table.take(pa.array(order, pa.int64()))
    return [table.slice(int(starts[i]), int(starts[i + 1] - starts[i])) for i in range(n)]


def _batch(piece: pa.Table, schema: pa.Schema) -> pa.RecordBatch:
    piece = piece.cast(schema).combine_chunks()
    if piece.num_rows:
        return piece.to_batches()[0]
    return pa.RecordBatch.from_arrays([pa.array([], f.type) for f in schema], schema=schema)


def write_buckets(
    path: str | os.PathLike, schema: pa.Schema, pieces: Iterable[pa.Table], meta: dict | None = None
) -> None:
    """One record batch per piece, in order (empty ones too), atomically; `meta` (JSON values) in the file's
    schema. `pieces` may be a generator: one piece is held at a time."""
    schema = schema.with_metadata({k: json.dumps(v) for k, v in (meta or {}).items()})
    with atomic_open(path) as f, pa.ipc.new_file(f, schema) as w:
        for piece in pieces:
            w.write_batch(_batch(piece, schema))


def write_cut(
    path: str | os.PathLike, schema: pa.Schema, table: pa.Table, index: np.ndarray, n: int, meta: dict | None = None
) -> None:
    """`table` cut into `n` buckets by `index` (rows keep their order within one), written by write_buckets."""
    write_buckets(path, schema, cut(table.cast(schema.remove_metadata()), index, n), meta)


def read_bucket(
    paths: str | os.PathLike | Iterable[str | os.PathLike], i: int, schema: pa.Schema, again: str = "make it again"
) -> pa.Table:
    """Bucket `i`'s rows of every file, in file order; `again` says what a file with too few buckets needs."""
    pieces = []
    for path in [paths] if isinstance(paths, str | os.PathLike) else paths:
        with pa.memory_map(str(path)) as src:
            reader = pa.ipc.open_file(src)
            if i >= reader.num_record_batches:
                raise ValueError(f"{path} has {reader.num_record_batches} batches, not {i + 1}: {again}")
            batch = reader.get_batch(i)
        if batch.num_rows:
            pieces.append(pa.Table.from_batches([batch]).replace_schema_metadata(None))
    return pa.concat_tables(pieces).cast(schema) if pieces else schema.empty_table()


def read_all(path: str | os.PathLike, schema: pa.Schema) -> pa.Table:
    """Every bucket's rows of one file."""
    with pa.memory_map(str(path)) as src:
        return pa.ipc.open_file(src).read_all().replace_schema_metadata(None).cast(schema)


def read_meta(path: str | os.PathLike) -> dict:
    """The `meta` a file was written with."""
    with pa.memory_map(str(path)) as src:
        meta = pa.ipc.open_file(src).schema.metadata or {}
    return {k.decode(): json.loads(v) for k, v in meta.items()}
