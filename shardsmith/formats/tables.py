"""Dataset-wide tables without holding them: keys sorted into bins on disk, parquet written part by part.

plan_shards, index_shards and validate_dataset see every sample of a dataset. Holding their rows costs
~420 B per sample (1 GiB at 2.5M samples). Finding repeated keys needs every key, but not at once: keys are
sorted into bins by hash (every row of a key in one bin), and each bin is decided on its own, so memory
stays at one bin and one part whatever the dataset's size.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from shardsmith.core.atomic import atomic_open

if TYPE_CHECKING:  # imported where used: jobs that never need pandas start 0.3 s sooner without it
    import pandas as pd


def key_hashes(keys: Iterable[str]) -> np.ndarray:
    """64-bit hashes of keys; pandas' hash_array uses a fixed key, so they are the same in every run."""
    import pandas as pd

    return pd.util.hash_array(
        np.asarray(keys if isinstance(keys, (pd.Series, np.ndarray)) else list(keys), dtype=object)
    )


def num_rows(path: str | os.PathLike) -> int:
    """Rows of a parquet file, from its footer."""
    return pq.ParquetFile(path).metadata.num_rows


class Spill:
    """Arrow tables sorted into `n` bins, kept in memory when n is 1 and in Arrow IPC files under `folder`
    otherwise, so a dataset-wide pass holds one bin at a time whatever the dataset's size."""

    def __init__(self, folder: str | os.PathLike | None, n: int, schema: pa.Schema) -> None:
        self.n, self.schema = max(1, n), schema
        self._mem: list[list[pa.Table]] | None = None
        if self.n == 1 or folder is None:
            self.n, self._mem = 1, [[]]
            return
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._writers = [pa.ipc.new_file(self.folder / f"{i:05d}.arrow", schema) for i in range(self.n)]

    def add(self, table: pa.Table, bins: np.ndarray) -> None:
        """Append each row of `table` to the bin given for it (rows keep their order within a bin)."""
        table = table.cast(self.schema)
        if self._mem is not None:
            self._mem[0].append(table)
            return
        order = np.argsort(bins, kind="stable")
        sorted_bins = bins[order]
        cuts = np.flatnonzero(np.diff(sorted_bins)) + 1
        for idx in np.split(order, cuts):
            if len(idx):
                self._writers[int(bins[idx[0]])].write_table(table.take(pa.array(idx)))

    def close(self) -> None:
        if self._mem is None:
            for w in self._writers:
                w.close()

    def read(self, i: int) -> pa.Table:
        if self._mem is not None:
            return pa.concat_tables(self._mem[0]) if self._mem[0] else self.schema.empty_table()
        with pa.OSFile(str(self.folder / f"{i:05d}.arrow")) as src:  # read into memory: the file goes soon after
            return pa.ipc.open_file(src).read_all()


def spill_folder(parent: str | os.PathLike | None) -> tempfile.TemporaryDirectory:
    """A `.spill-*` folder in `parent` for a job's bins, removed when the job ends. One a killed job left
    behind is never read again: the job that makes a new one removes the old ones first (Snakemake runs
    one such job per folder at a time). `parent` is made if missing (a scratch folder someone cleaned away)."""
    if parent is not None:
        Path(parent).mkdir(parents=True, exist_ok=True)
        for old in Path(parent).glob(".spill-*"):
            shutil.rmtree(old, ignore_errors=True)
    return tempfile.TemporaryDirectory(prefix=".spill-", dir=parent)


BIN_ROWS = 250_000  # rows per bin of a Spill: a bin of keys and ids, decided in pandas, costs ~100-150 MB


def bins_for(rows: int, most: int = 512) -> int:
    """How many bins keep each under BIN_ROWS rows (at most `most` files open at once)."""
    return min(most, max(1, -(-rows // BIN_ROWS)))


def key_bins(keys: pa.Array | pa.ChunkedArray, n: int) -> np.ndarray:
    """The bin of each key: every row of one key lands in the same bin."""
    if n == 1:  # no hashing, and no Python string per key
        return np.zeros(len(keys), dtype=np.int64)
    return (key_hashes(keys.to_numpy(zero_copy_only=False)) % np.uint64(n)).astype(np.int64)


class ParquetAppender:
    """One parquet file written a table at a time (a pandas frame or an Arrow table), under a temporary name
    until `close()`.

    The first table fixes the schema (a column all null in it is taken as text); later ones are cast to
    it, so an empty or all-null part does not change a column's type. Without any rows, the file has
    `columns`, typed null (pandas reads them as object columns, as it wrote them before). `metadata`: the
    file's key-value metadata.
    """

    def __init__(self, path: str | os.PathLike, columns: list[str], metadata: dict[str, str] | None = None) -> None:
        self._open = atomic_open(path)
        self._file = self._open.__enter__()
        self._columns = list(columns)
        self._metadata = metadata
        self._writer: pq.ParquetWriter | None = None
        self.rows = 0

    def append(self, frame: pd.DataFrame | pa.Table) -> None:
        if len(frame) == 0:  # no empty row groups: the file does not depend on how its rows were cut
            return
        if isinstance(frame, pa.Table):  # what pandas wrote into its source's metadata no longer applies
            table = frame.replace_schema_metadata(None)
        else:
            table = pa.Table.from_pandas(frame, preserve_index=False)
        if self._writer is None:  # a column all null in the first table would refuse every later value
            schema = pa.schema([f.with_type(pa.string()) if pa.types.is_null(f.type) else f for f in table.schema])
            self._writer = pq.ParquetWriter(self._file, schema)
            table = table.cast(schema)
        else:
            table = table.cast(self._writer.schema)
        self._writer.write_table(table)
        self.rows += len(frame)

    def close(self) -> None:
        if self._writer is None:
            empty = pa.table({c: pa.nulls(0) for c in self._columns})
            pq.write_table(empty.replace_schema_metadata(self._metadata), self._file)
        else:
            if self._metadata:
                self._writer.add_key_value_metadata(self._metadata)
            self._writer.close()
        self._open.__exit__(None, None, None)

    def abort(self, exc: BaseException) -> None:
        if self._writer is not None:
            self._writer.close()
        with contextlib.suppress(BaseException):  # the contextmanager re-raises what it was given: the caller does
            self._open.__exit__(type(exc), exc, exc.__traceback__)

    def __enter__(self) -> ParquetAppender:
        return self

    def __exit__(self, et, exc, tb) -> None:
        if exc is None:
            self.close()
        else:
            self.abort(exc)


def repeated_keys(paths: list[str], column: str = "key", tmp: str | os.PathLike | None = None) -> list[str]:
    """Keys that occur more than once in the tables (each once, sorted), holding one bin of keys at a time: the
    keys are sorted into bins by hash (on disk under `tmp` for more than BIN_ROWS rows), and each bin is
    counted on its own."""
    n = bins_for(sum(num_rows(p) for p in paths))
    with spill_folder(tmp) as spill_dir:
        spill = Spill(spill_dir if n > 1 else None, n, pa.schema([(column, pa.large_string())]))
        for path in paths:
            for batch in pq.ParquetFile(path).iter_batches(columns=[column], batch_size=65536):
                spill.add(pa.Table.from_batches([batch]), key_bins(batch.column(0), n))
        spill.close()
        found: list[str] = []
        for i in range(n):
            counts = spill.read(i).column(column).value_counts()
            found += [c["values"] for c in counts.to_pylist() if c["counts"] > 1]
    return sorted(found)
