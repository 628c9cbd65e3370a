"""Dataset-wide tables without holding them: key hashes for duplicate checks, parquet written part by part.

plan_shards, index_shards and validate_dataset see every sample of a dataset. Holding their rows costs
~420 B per sample (1 GiB at 2.5M samples); these helpers keep 8-16 B per sample (a key's 64-bit hash and
its sort) and one part's rows, so those jobs stay under 1 GiB to ~40M samples.
"""

import os
from collections.abc import Iterable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from shardsmith.tario import atomic_open


def key_hashes(keys: Iterable[str]) -> np.ndarray:
    """64-bit hashes of keys; pandas' hash_array uses a fixed key, so they are the same in every run."""
    return pd.util.hash_array(np.asarray(keys if isinstance(keys, (pd.Series, np.ndarray)) else list(keys), dtype=object))


def num_rows(path: str | os.PathLike) -> int:
    """Rows of a parquet file, from its footer."""
    return pq.ParquetFile(path).metadata.num_rows


def dataset_key_hashes(paths: list[str], column: str = "key") -> np.ndarray:
    """The hash of every key of the tables, in table and row order, read one table at a time."""
    out = np.empty(sum(num_rows(p) for p in paths), dtype=np.uint64)
    at = 0
    for path in paths:
        for batch in pq.ParquetFile(path).iter_batches(columns=[column], batch_size=65536):
            h = key_hashes(batch.column(0).to_numpy(zero_copy_only=False))
            out[at : at + len(h)] = h
            at += len(h)
    return out


def repeated(hashes: np.ndarray) -> np.ndarray:
    """Positions (ascending) of every hash that occurs more than once: where duplicate keys can be.

    Equal hashes are candidates only; callers compare the keys themselves (a 64-bit collision between
    different keys is possible at billions of samples).
    """
    order = np.argsort(hashes, kind="stable")
    ordered = hashes[order]
    same = ordered[1:] == ordered[:-1]
    del ordered
    hit = np.zeros(len(hashes), dtype=bool)
    hit[1:] |= same
    hit[:-1] |= same
    return np.sort(order[hit])


class ParquetAppender:
    """One parquet file written a pandas frame at a time, under a temporary name until `close()`.

    The first frame fixes the schema (as pandas would write it); later frames are cast to it, so an empty
    or all-null part does not change a column's type. Without any frame, `empty` gives the columns.
    """

    def __init__(self, path: str | os.PathLike, empty: pd.DataFrame) -> None:
        self._open = atomic_open(path)
        self._file = self._open.__enter__()
        self._empty = empty
        self._writer: pq.ParquetWriter | None = None
        self.rows = 0

    def append(self, frame: pd.DataFrame) -> None:
        if self._writer is None:
            if len(frame) == 0:
                return
            table = pa.Table.from_pandas(frame, preserve_index=False)
            self._writer = pq.ParquetWriter(self._file, table.schema)
        else:
            table = pa.Table.from_pandas(frame, preserve_index=False).cast(self._writer.schema)
        self._writer.write_table(table)
        self.rows += len(frame)

    def close(self) -> None:
        if self._writer is None:
            self._empty.to_parquet(self._file, index=False)
        else:
            self._writer.close()
        self._open.__exit__(None, None, None)

    def abort(self, exc: BaseException) -> None:
        if self._writer is not None:
            self._writer.close()
        try:
            self._open.__exit__(type(exc), exc, exc.__traceback__)
        except BaseException:  # the contextmanager re-raises what it was given: the caller raises it
            pass

    def __enter__(self) -> "ParquetAppender":
        return self

    def __exit__(self, et, exc, tb) -> None:
        if exc is None:
            self.close()
        else:
            self.abort(exc)


def repeated_keys(paths: list[str], column: str = "key") -> list[str]:
    """Keys that occur more than once in the tables (each once, in first-seen order), with 8-25 bytes a row
    held: the hashes find the candidates, the keys themselves decide."""
    candidates = repeated(dataset_key_hashes(paths, column))
    if not len(candidates):
        return []
    seen: dict[str, int] = {}
    at = 0
    for path in paths:
        for batch in pq.ParquetFile(path).iter_batches(columns=[column], batch_size=65536):
            lo, hi = np.searchsorted(candidates, [at, at + batch.num_rows])
            keys = batch.column(0)
            for pos in candidates[lo:hi]:
                key = keys[int(pos - at)].as_py()
                seen[key] = seen.get(key, 0) + 1
            at += batch.num_rows
    return [k for k, n in seen.items() if n > 1]
