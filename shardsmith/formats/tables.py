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

from shardsmith.core.atomic import UMASK, atomic_open

if TYPE_CHECKING:  # imported where used: jobs that never need pandas start 0.3 s sooner without it
    import pandas as pd


def key_hashes(keys: Iterable[str]) -> np.ndarray:
    """64-bit hashes of keys; pandas' hash_array uses a fixed key, so they are the same in every run."""
    import pandas as pd

    return pd.util.hash_array(
        np.asarray(keys if isinstance(keys, (pd.Series, np.ndarray)) else list(keys), dtype=object)
    )


# Key digests: a 64-bit hash of each key computed on Arrow's string buffers (no Python string per key), and
# their sum mod 2**64, which is the same however the keys are split into pieces and in whatever order they
# come. Sums of the planned keys (per bucket) and of the keys the loader read (per shard) must agree.
_DIGEST_SEED = 0x5EED_5A4D  # fixed: digests are compared across jobs and runs
_MASK = (1 << 64) - 1


def _coefficients(n: int) -> np.ndarray:
    return np.random.default_rng(_DIGEST_SEED).integers(0, 2**64, size=max(n, 1), dtype=np.uint64, endpoint=False)


def _digest(data: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Each string's digest: a random linear form of its bytes and length (position i weighted by the i-th
    fixed coefficient), then splitmix64's finaliser, so that equal sums of digests mean equal multisets but
    for a 2**-64 chance."""
    lengths = np.diff(offsets)
    start = offsets[0]
    body = data[start : offsets[-1]].astype(np.uint64)
    coef = _coefficients(int(lengths.max()) + 1 if len(lengths) else 1)
    with np.errstate(over="ignore"):
        position = np.arange(len(body), dtype=np.int64) - np.repeat(offsets[:-1] - start, lengths)
        sums = np.concatenate([np.zeros(1, np.uint64), np.cumsum(body * coef[position], dtype=np.uint64)])
        z = sums[offsets[1:] - start] - sums[offsets[:-1] - start] + lengths.astype(np.uint64) * coef[0]
        z ^= z >> np.uint64(30)
        z *= np.uint64(0xBF58476D1CE4E5B9)
        z ^= z >> np.uint64(27)
        z *= np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    return z


def key_digest_sum(keys: pa.Array | pa.ChunkedArray | list[str]) -> int:
    """The sum mod 2**64 of the keys' digests (see _digest): Arrow strings read from their buffers, a list of
    Python strings joined (pa.array would import pandas into jobs that otherwise never load it)."""
    if isinstance(keys, list):
        encoded = [k.encode() for k in keys]
        data = np.frombuffer(b"".join(encoded), np.uint8)
        offsets = np.concatenate([np.zeros(1, np.int64), np.cumsum([len(e) for e in encoded], dtype=np.int64)])
        return int(np.sum(_digest(data, offsets), dtype=np.uint64)) if encoded else 0
    total = 0
    chunks = keys.chunks if isinstance(keys, pa.ChunkedArray) else [keys]
    for chunk in chunks:
        chunk = chunk.cast(pa.large_string())
        if len(chunk) == 0:
            continue
        _, offsets, data = chunk.buffers()
        offsets = np.frombuffer(offsets, np.int64)[chunk.offset : chunk.offset + len(chunk) + 1]
        total += int(np.sum(_digest(np.frombuffer(data, np.uint8), offsets), dtype=np.uint64))
    return total & _MASK


def num_rows(path: str | os.PathLike) -> int:
    """Rows of a parquet file, or of a table written in pieces (a folder of them), from the footers."""
    return sum(pq.ParquetFile(f).metadata.num_rows for f in table_files(path))


def table_files(path: str | os.PathLike) -> list[str]:
    """The parquet files of a table: the file itself, or a folder's `*.parquet` files in name order (a table
    written in pieces, as index_shards writes manifest.parquet/ and rejected.parquet/)."""
    if os.path.isdir(path):
        return sorted(str(p) for p in Path(path).glob("*.parquet") if p.is_file())
    return [str(path)]


def assemble_folder(pieces: list[tuple[str, str | os.PathLike]], folder: str | os.PathLike, schema: pa.Schema) -> int:
    """A table as a folder of parquet pieces, `{name: piece}`, replacing `folder` whole; returns its rows.

    A piece that already has `schema` is hard-linked (no byte of it read, so the folder costs a link per
    piece however many rows it holds), or copied where the folder is on another file system; any other piece
    is rewritten with the schema, so every file of the folder reads the same. The folder is filled under a
    temporary name (`.{name}.{random}.partial`, which a later run cleans if this one is killed) and renamed
    into place: readers see the old table or the new one, never a part of it.
    """
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    rows = 0
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".partial", dir=folder.parent))
    try:
        os.chmod(tmp, 0o777 & ~UMASK)  # mkdtemp makes 0700; readers (training jobs) may be other users
        for name, piece in pieces:
            f = pq.ParquetFile(piece)
            rows += f.metadata.num_rows
            if f.schema_arrow.remove_metadata().equals(schema):
                try:
                    os.link(piece, tmp / name)
                except OSError:  # another file system, or links refused
                    shutil.copyfile(piece, tmp / name)
            else:
                table = f.read(columns=schema.names).replace_schema_metadata(None)
                pq.write_table(table.cast(schema), tmp / name)
        old = None
        if folder.exists() or folder.is_symlink():  # a single file from an earlier layout, or the last folder
            old = folder.parent / f".{folder.name}.{os.urandom(4).hex()}.deleting"
            os.rename(folder, old)
        os.rename(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        if old.is_dir():
            shutil.rmtree(old)
        else:
            old.unlink()
    return rows


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
