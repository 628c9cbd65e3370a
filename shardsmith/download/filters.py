"""Filters on manifest columns: which records are never downloaded, and the ledger row each one gets.

A filter is data, never code: a column, a comparison from a closed list and a value (`punsafe < 0.5`), and
it keeps the records for which that holds. They are applied when parts are planned (sources.plan_parts),
a chunk of a manifest at a time with pandas' vectorised comparisons: a record that fails one stays in its
part, marked with the filter's name and the value it had, so record ids and the raw cache do not move when
a filter changes; download_part requests none of them and files each as `filter/<name>` in the ledger.
"""

from __future__ import annotations

import json
import math
import operator
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shardsmith.core.errors import ConfigError
from shardsmith.core.ledger import filter_name

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd
    import pyarrow as pa

NUMERIC_OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}
EQUALITY_OPS = {"==": operator.eq, "!=": operator.ne}
SET_OPS = ("in", "not_in")
FILE_OPS = ("in_file", "not_in_file")  # the value is an id list: a text file (an id a line) or a parquet file
OPS = (*NUMERIC_OPS, *EQUALITY_OPS, *SET_OPS, *FILE_OPS)
# The columns a part's records table gains when its source has filters: the name of the first filter a
# record fails ("" when it passes them all) and what it saw.
FILTER_COLUMNS = ["filter", "filter_detail"]
_DETAIL_CHARS = 120  # a cell's text in a ledger detail is cut to this
ID_LISTS = "id_lists.json"  # beside the part plans: what each id-list filter matched (id_list_reports)
# Text that means an empty cell where a number is read (pandas' and Spark's CSV writers, Python's str(None))
MISSING_TEXT = ["nan", "null", "none", "na", "n/a", "<na>"]


# A cell's text read as a boolean: Python's and pandas' True, Spark's and JSON's true, a 0/1 flag column
_TRUTH = {"true": True, "false": False, "1": True, "0": False, "1.0": True, "0.0": False}


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _written(value: object) -> str:
    """A value as a person writes it: 0.5, 200, 0.2799, en. A float is its shortest exact form in its own
    precision (numpy's float32 0.8 is 0.8), a whole one without its `.0` (1000001, not 1e+06)."""
    import numpy as np

    if isinstance(value, float | np.floating) and not isinstance(value, bool):
        if math.isfinite(value) and float(value).is_integer() and abs(value) < 1e16:
            return str(int(value))
        return str(value) if isinstance(value, np.floating) else repr(value)
    return str(value)


@dataclass(frozen=True)
class Filter:
    """Keep the records whose `column op value` holds."""

    name: str
    column: str
    op: str
    value: object
    sources: tuple[str, ...] | None = None  # None: every manifest source
    keep_missing: bool = False

    @property
    def rule(self) -> str:
        """`punsafe < 0.5`, `LANGUAGE in [en, de]`: the rule as the ledger, report and card show it."""
        shown = f"[{', '.join(map(_written, self.value))}]" if self.op in SET_OPS else _written(self.value)
        return f"{self.column} {self.op} {shown}"

    def applies_to(self, source: str) -> bool:
        return self.sources is None or source in self.sources

    @property
    def boolean(self) -> bool:
        """Cells are read as true or false: == and != with true or false, in with those only."""
        values = self.value if self.op in SET_OPS else (self.value,)
        return self.op in (*EQUALITY_OPS, *SET_OPS) and all(isinstance(v, bool) for v in values)

    @property
    def numeric(self) -> bool:
        """Cells are read as numbers: the order comparisons, == and != with a number, in with numbers only."""
        if self.op in FILE_OPS:
            return False
        if self.op in NUMERIC_OPS:
            return True
        if self.op in SET_OPS:
            return all(_is_number(v) for v in self.value)
        return _is_number(self.value)


def parse_filters(items: Sequence[dict], sources: Sequence[dict]) -> list[Filter]:
    """The config's `filters` checked against its sources; ConfigError naming the key for what a schema
    cannot say (value types per comparison, unknown or non-manifest sources, two filters of one name)."""
    manifests = {s["name"] for s in sources if s["type"] == "manifest"}
    kinds = {s["name"]: s["type"] for s in sources}
    out: list[Filter] = []
    seen: dict[str, int] = {}
    for i, item in enumerate(items):
        where = f"filters[{i}]"
        op, value = item["op"], item["value"]
        name = filter_name(item)
        if op in FILE_OPS:
            if not isinstance(value, str) or not (os.path.isfile(value) or os.path.isdir(value)):
                raise ConfigError(
                    f"{where}.value: '{op}' takes an id list (text, CSV, TSV or parquet, a file or a parquet folder); "
                    f"no such file {value!r}."
                )
            id_list_format(value)
        elif op in SET_OPS:
            if not isinstance(value, list) or not value:
                raise ConfigError(f"{where}.value: '{op}' takes a non-empty list, got {value!r}.")
            value = tuple(value)
        elif isinstance(value, list):
            raise ConfigError(f"{where}.value: '{op}' takes one value, got a list; use 'in' for a list.")
        if op in NUMERIC_OPS and not _is_number(value):
            hint = ""
            if isinstance(value, str) and re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+", value):
                hint = f" (YAML reads {value} as text: write {float(value)!r})"  # YAML 1.1 wants a dot: 1.0e-3
            raise ConfigError(f"{where}.value: '{op}' compares numbers, got {value!r}{hint}.")
        names = item.get("sources")
        for s in names or ():
            if s not in kinds:
                raise ConfigError(f"{where}.sources: no source is named '{s}'; the sources are {sorted(kinds)}.")
            if s not in manifests:
                raise ConfigError(
                    f"{where}.sources: source '{s}' is a {kinds[s]} source; filters apply to manifest columns."
                )
        if name in seen:
            raise ConfigError(
                f"{where}: filters[{seen[name]}] has the same name '{name}'; give one a name of its own (name: ...)."
            )
        seen[name] = i
        out.append(
            Filter(name, item["column"], op, value, tuple(names) if names else None, bool(item.get("keep_missing")))
        )
    if out and not manifests:
        raise ConfigError("filters: they apply to manifest columns, and no source is a manifest.")
    return out


def filters_for(filters: Sequence[Filter], source: str) -> list[Filter]:
    return [f for f in filters if f.applies_to(source)]


def check_columns(filters: Sequence[Filter], path: str, columns: Sequence[str]) -> None:
    """A filter naming a column the manifest lacks: one line naming the filter and the columns it has."""
    for f in filters:
        if f.column not in columns:
            raise ConfigError(
                f"filter '{f.name}' ({f.rule}) names column '{f.column}', which manifest {path} lacks; "
                f"its columns are {list(columns)}."
            )


def _as_text(cells: pd.Series) -> pd.Series:
    """Cells as text, a float as a person writes it (_written): an integer id column with an empty cell is float64
    in a parquet file pandas wrote, and its 1000001.0 must be the 1000001 an id list or `in` names."""
    import numpy as np
    import pandas as pd

    text = cells.astype("string")  # a float32 in its shortest form (0.8, not 0.800000011920929)
    if cells.dtype.kind == "f":
        values = cells.to_numpy()
        with np.errstate(invalid="ignore"):
            whole = np.isfinite(values) & (np.floor(values) == values) & (np.abs(values) < 1e16)
        text[whole] = values[whole].astype(np.int64).astype(str)
    elif cells.dtype == object and cells.map(lambda v: isinstance(v, float)).any():
        text = pd.Series([_written(v) if isinstance(v, float) and v == v else v for v in cells], index=cells.index)
        text = text.astype("string")
    return text


def _shown(cell: object) -> str:
    text = _written(cell)
    return text if len(text) <= _DETAIL_CHARS else text[: _DETAIL_CHARS - 3] + "..."


def apply_filters(
    df: pd.DataFrame, filters: Sequence[Filter], id_lists: IdLists | None = None
) -> tuple[list[str], list[str]]:
    """(name of the first filter each row fails or "", what it saw) for every row of a manifest chunk;
    `id_lists`: the id lists read so far (those of in_file and not_in_file), kept across chunks."""
    import numpy as np
    import pandas as pd

    n = len(df)
    names = np.full(n, "", dtype=object)
    details = np.full(n, "", dtype=object)
    open_rows = np.ones(n, dtype=bool)
    for f in filters:
        cells = df[f.column]
        text = cells.astype("string") if f.numeric else _as_text(cells)  # compared as numbers, or as text
        missing = (cells.isna() | text.str.strip().eq("")).to_numpy(dtype=bool, na_value=True)
        if f.op in FILE_OPS:
            ids = (IdLists() if id_lists is None else id_lists).of(f)
            bad = np.zeros(n, dtype=bool)
            held = ids.holds(text.fillna("").str.strip().to_numpy(dtype=object))
        elif f.boolean:
            truth = text.str.strip().str.lower().map(_TRUTH).to_numpy(dtype=object, na_value=None)
            bad = ~missing & np.array([t is None for t in truth], dtype=bool)
            values = f.value if f.op in SET_OPS else (f.value,)
            held = np.array([t in values for t in truth], dtype=bool)
            if f.op == "!=":
                held = ~held
        elif f.numeric:
            missing |= text.str.strip().str.lower().isin(MISSING_TEXT).to_numpy(dtype=bool, na_value=False)
            numbers = pd.to_numeric(cells, errors="coerce").astype("float64").to_numpy()
            bad = ~missing & ~np.isfinite(numbers)  # text where a number is needed, or inf
            # the values compared in the column's own precision: float32's 0.8 is below float64's 0.8, and a
            # LAION pwatermark of 0.8 must pass `pwatermark <= 0.8`
            kind = cells.dtype if cells.dtype.kind == "f" else np.dtype("float64")
            with np.errstate(invalid="ignore"):
                if f.op in SET_OPS:
                    held = np.isin(numbers, np.asarray(f.value, dtype=kind).astype("float64"))
                else:
                    held = (NUMERIC_OPS | EQUALITY_OPS)[f.op](numbers, float(np.asarray(f.value, dtype=kind)))
            # beyond 2^53 a float64 holds every other integer only: ids and hashes (a tweet's id, LAION's hash)
            # are compared exactly there, as Python compares ints and floats (a float column's cells are floats)
            exact = cells.dtype.kind != "f"
            for i in np.flatnonzero(~missing & ~bad & (np.abs(numbers) >= _EXACT)) if exact else ():
                held[i] = _holds_exactly(f, cells.iat[i])
        else:
            strings = text.fillna("").str.strip().to_numpy(dtype=object)
            bad = np.zeros(n, dtype=bool)
            if f.op in SET_OPS:
                held = np.isin(strings, np.asarray([_written(v) for v in f.value], dtype=object))
            else:
                held = EQUALITY_OPS[f.op](strings, _written(f.value))
        if f.op in ("not_in", "not_in_file"):
            held = ~held
        fails = open_rows & np.where(missing, not f.keep_missing, bad | ~held)
        for i in np.flatnonzero(fails):
            if missing[i]:
                seen = f"{f.column} is empty"
            elif bad[i]:
                kind = "true or false" if f.boolean else "a finite number"
                seen = f"{f.column} is {_shown(cells.iat[i])!r}, not {kind}"
            else:
                seen = f"{f.column} is {_shown(cells.iat[i])}"
            names[i], details[i] = f.name, f"{seen}; kept: {f.rule}"
        open_rows &= ~fails
    return names.tolist(), details.tolist()


_EXACT = 2.0**53  # the first integer from which a float64 cannot hold every integer


def _holds_exactly(f: Filter, cell: object) -> bool:
    """`cell op value` for a number cell, in Python's exact comparison of ints and floats."""
    if isinstance(cell, str | bytes):
        text = (cell.decode() if isinstance(cell, bytes) else cell).strip()
        try:
            cell = int(text)
        except ValueError:
            cell = float(text)
    elif hasattr(cell, "item"):
        cell = cell.item()  # a numpy scalar: its exact Python int or float
    if f.op in SET_OPS:
        return any(cell == v for v in f.value)
    return (NUMERIC_OPS | EQUALITY_OPS)[f.op](cell, f.value)


def id_list_format(path: str) -> str:
    """How an id list is read: `parquet` (a file, or a folder of them as Spark and shardsmith's manifest write
    it), `csv` or `tsv` (a header, then the filter's column or the only one), or `text` (an id a line); a ConfigError
    for a format that holds no text ids (NumPy's .npy, DataComp's uid arrays: write them as parquet)."""
    name = path.rstrip("/").lower()
    if name.endswith(".parquet") or os.path.isdir(path):
        return "parquet"
    if name.endswith((".csv", ".csv.gz")):
        return "csv"
    if name.endswith((".tsv", ".tsv.gz")):  # a spreadsheet's export: each line as a whole id would match nothing
        return "tsv"
    if name.endswith((".npy", ".npz", ".pkl", ".pickle")):
        raise ConfigError(
            f"id list {path}: a NumPy or pickle file holds no text ids; write them as parquet (a column of ids) "
            "or as text, an id a line (DataComp's uids: numpy's array as hex strings)."
        )
    return "text"


def _csv_as_text(path: str, kind: str) -> object:
    """A CSV or TSV file's format with every column read as text: inferred, img2dataset's key 000000123 would be
    the number 123 and an all-digit uid a float, and neither would match the record it names."""
    import pyarrow as pa
    import pyarrow.dataset as ds
    from pyarrow import csv

    parse = csv.ParseOptions(delimiter="\t", quote_char=False) if kind == "tsv" else csv.ParseOptions()
    with csv.open_csv(path, parse_options=parse) as reader:  # the header: the first block only
        names = reader.schema.names
    types = csv.ConvertOptions(column_types=dict.fromkeys(names, pa.string()))
    return ds.CsvFileFormat(parse_options=parse, convert_options=types)


def _read_ids(path: str, kind: str, column: str) -> pa.Array:
    """The cells of an id list as text (nulls dropped); an empty file lists no id (an empty takedown list)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if os.path.isfile(path) and os.path.getsize(path) == 0:
        return pa.array([], pa.string())
    if kind in ("parquet", "csv", "tsv"):  # a table: the filter's column, or its only one
        import pyarrow.dataset as ds

        table = ds.dataset(path, format=kind if kind == "parquet" else _csv_as_text(path, kind))
        if not table.files:
            raise ConfigError(f"id list {path}: the folder holds no {kind} file.")
        names = table.schema.names
        if column not in names and len(names) != 1:
            raise ConfigError(
                f"id list {path}: give it one column, or one named {column!r} as the filter's; it has {names}."
            )
        cells = table.to_table(columns=[column if column in names else names[0]]).column(0)
        return pc.cast(cells.combine_chunks(), pa.string()).drop_null()
    from pyarrow import csv

    cells = csv.read_csv(
        path,
        read_options=csv.ReadOptions(column_names=["id"]),
        parse_options=csv.ParseOptions(delimiter="\x1f", quote_char=False, escape_char=False),
        convert_options=csv.ConvertOptions(column_types={"id": pa.string()}),
    ).column(0)
    return cells.combine_chunks() if cells.num_chunks else pa.array([], pa.string())


class IdList:
    """The ids of an id list file, and which of them a record has matched (`holds`, over every chunk of every
    source the filter reads), so that the ids no record has are named once every manifest is read.

    Held compactly: the distinct ids as one Arrow string array, and their 64-bit hashes in a pandas index, whose
    hash table is built once. A record's id is looked up by its hash, then compared with the listed id itself,
    so a collision of hashes never matches a record that is not listed. About 70 bytes an id of 32 characters
    (a Python string each would take 150 more)."""

    def __init__(self, path: str, column: str) -> None:
        import numpy as np
        import pandas as pd
        import pyarrow as pa
        import pyarrow.compute as pc

        kind = id_list_format(path)
        try:
            cells = _read_ids(path, kind, column)
        except (pa.ArrowException, OSError) as e:  # a corrupt file, or one not of its format
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ConfigError(f"id list {path} cannot be read as {kind}: {first}") from None
        listed = pc.utf8_trim_whitespace(cells)
        del cells  # each step copies the ids: the list is held twice at most while it is read
        listed = listed.filter(pc.not_equal(listed, ""))
        self.path, self.listed = path, len(listed)
        self.ids = pc.unique(listed)
        del listed
        self.duplicates = self.listed - len(self.ids)
        codes = np.concatenate(
            [np.zeros(0, np.uint64)]
            + [_hashes(self.ids.slice(i, _HASH_CHUNK)) for i in range(0, len(self.ids), _HASH_CHUNK)]
        )
        self.codes = pd.Index(codes)
        if not self.codes.is_unique:  # two listed ids share a hash (about 1 in 10^7 at 10^6 ids): look up by text
            self.codes = pd.Index(self.ids.to_numpy(zero_copy_only=False))
            self.by_text = True
        else:
            self.by_text = False
        self.matched = np.zeros(len(self.ids), dtype=bool)

    def holds(self, values: np.ndarray) -> np.ndarray:
        """Which of `values` (ids as text) the list holds; those it holds are marked matched."""
        import numpy as np
        import pyarrow as pa

        values = np.asarray(values, dtype=object)
        if self.by_text:
            where = self.codes.get_indexer(values)
        else:
            where = self.codes.get_indexer(_hashes(pa.array(values, pa.string())))
            found = np.flatnonzero(where >= 0)  # the same hash: the same id, unless two ids collide
            listed = self.ids.take(pa.array(where[found])).to_numpy(zero_copy_only=False)
            where[found[listed != values[found]]] = -1
        self.matched[where[where >= 0]] = True
        return where >= 0

    def report(self, examples: int = 10) -> dict:
        import numpy as np
        import pyarrow as pa

        unknown = np.flatnonzero(~self.matched)
        return {
            "file": self.path,
            "ids_listed": self.listed,
            "ids": len(self.ids),
            "listed_more_than_once": self.duplicates,
            "matched": int(self.matched.sum()),
            "unknown": len(unknown),
            "unknown_examples": self.ids.take(pa.array(unknown[:examples], pa.int64())).to_pylist(),
        }


_HASH_CHUNK = 1 << 20  # ids hashed at a time: each chunk passes through Python strings once


def _hashes(ids: pa.Array) -> np.ndarray:
    """64-bit hashes of ids as text (pandas' siphash of each string)."""
    import pandas as pd

    return pd.util.hash_array(ids.to_numpy(zero_copy_only=False), categorize=False)


class IdLists(dict):
    """The id lists of a planning's filters, each read once and matched against every manifest it reads."""

    def of(self, f: Filter) -> IdList:
        if (f.value, f.column) not in self:
            self[(f.value, f.column)] = IdList(f.value, f.column)
        return self[(f.value, f.column)]


def id_list_reports(filters: Sequence[Filter], id_lists: IdLists, out: str | None = None) -> dict[str, dict]:
    """What each id-list filter matched, once every manifest is read: ids listed, listed more than once, matched,
    and the ids that match no record (unknown, the first few named). Written to `out` as JSON when given."""
    from shardsmith.core.atomic import atomic_write_text

    reports = {f.name: id_lists.of(f).report() for f in filters if f.op in FILE_OPS}
    if out and reports:
        atomic_write_text(out, json.dumps(reports, indent=1, sort_keys=True) + "\n")
    return reports
