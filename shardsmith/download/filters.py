"""Filters on manifest columns: which records are never downloaded, and the ledger row each one gets.

A filter is data, never code: a column, a comparison from a closed list and a value (`punsafe < 0.5`), and
it keeps the records for which that holds. They are applied when parts are planned (sources.plan_parts),
a chunk of a manifest at a time with pandas' vectorised comparisons: a record that fails one stays in its
part, marked with the filter's name and the value it had, so record ids and the raw cache do not move when
a filter changes; download_part requests none of them and files each as `filter/<name>` in the ledger.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shardsmith.core.errors import ConfigError
from shardsmith.core.ledger import filter_name

if TYPE_CHECKING:
    import pandas as pd

NUMERIC_OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}
EQUALITY_OPS = {"==": operator.eq, "!=": operator.ne}
SET_OPS = ("in", "not_in")
OPS = (*NUMERIC_OPS, *EQUALITY_OPS, *SET_OPS)
# The columns a part's records table gains when its source has filters: the name of the first filter a
# record fails ("" when it passes them all) and what it saw.
FILTER_COLUMNS = ["filter", "filter_detail"]
_DETAIL_CHARS = 120  # a cell's text in a ledger detail is cut to this


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _written(value: object) -> str:
    """A config value as a person wrote it: 0.5, 200, en."""
    return f"{value:g}" if isinstance(value, float) else str(value)


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
    def numeric(self) -> bool:
        """Cells are read as numbers: the order comparisons, == and != with a number, in with numbers only."""
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
        if op in SET_OPS:
            if not isinstance(value, list) or not value:
                raise ConfigError(f"{where}.value: '{op}' takes a non-empty list, got {value!r}.")
            value = tuple(value)
        elif isinstance(value, list):
            raise ConfigError(f"{where}.value: '{op}' takes one value, got a list; use 'in' for a list.")
        if op in NUMERIC_OPS and not _is_number(value):
            raise ConfigError(f"{where}.value: '{op}' compares numbers, got {value!r}.")
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


def _shown(cell: object) -> str:
    text = _written(cell.item() if hasattr(cell, "item") and not isinstance(cell, str) else cell)
    return text if len(text) <= _DETAIL_CHARS else text[: _DETAIL_CHARS - 3] + "..."


def apply_filters(df: pd.DataFrame, filters: Sequence[Filter]) -> tuple[list[str], list[str]]:
    """(name of the first filter each row fails or "", what it saw) for every row of a manifest chunk."""
    import numpy as np
    import pandas as pd

    n = len(df)
    names = np.full(n, "", dtype=object)
    details = np.full(n, "", dtype=object)
    open_rows = np.ones(n, dtype=bool)
    for f in filters:
        cells = df[f.column]
        text = cells.astype("string")
        missing = (cells.isna() | text.str.strip().eq("")).to_numpy(dtype=bool, na_value=True)
        if f.numeric:
            numbers = pd.to_numeric(cells, errors="coerce").astype("float64").to_numpy()
            bad = ~missing & np.isnan(numbers)  # text where a number is needed
            with np.errstate(invalid="ignore"):
                if f.op in SET_OPS:
                    held = np.isin(numbers, np.asarray(f.value, dtype="float64"))
                else:
                    held = (NUMERIC_OPS | EQUALITY_OPS)[f.op](numbers, float(f.value))
        else:
            strings = text.fillna("").to_numpy(dtype=object)
            bad = np.zeros(n, dtype=bool)
            if f.op in SET_OPS:
                held = np.isin(strings, np.asarray([_written(v) for v in f.value], dtype=object))
            else:
                held = EQUALITY_OPS[f.op](strings, _written(f.value))
        if f.op == "not_in":
            held = ~held
        fails = open_rows & np.where(missing, not f.keep_missing, bad | ~held)
        for i in np.flatnonzero(fails):
            if missing[i]:
                seen = f"{f.column} is empty"
            elif bad[i]:
                seen = f"{f.column} is {_shown(cells.iat[i])!r}, not a number"
            else:
                seen = f"{f.column} is {_shown(cells.iat[i])}"
            names[i], details[i] = f.name, f"{seen}; kept: {f.rule}"
        open_rows &= ~fails
    return names.tolist(), details.tolist()
