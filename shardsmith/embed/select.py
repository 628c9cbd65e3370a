"""Selection over the whole dataset: the samples kept by score (`select` in the config), decided before the
shards are planned, so that the shards stay uniform.

A selection rule keeps the top fraction of the scored samples by a column of the parts' score tables
(`top_fraction`, DataComp's "CLIP score top 30%": a fraction transfers between models, a cut-off does not), or
those at or above a value (`min`, LAION-2B-en's "ViT-B/32 similarity at least 0.28"). Every rule applies to
the whole pool of scored samples; a sample is kept when it passes them all, and the ledger names the first it
fails (`select/{name}`, with its score and the threshold).

No job holds every score. A job per slice of groups (`summarize_scores`) writes each group's histogram of a
fraction rule's column over a float's top KEY_BITS bits (sign, exponent and 15 mantissa bits: scores within
2**-15 of each other, relative, share a bin); one job (`decide_selection`) merges them into the bin the
fraction's count ends in, and how many of that bin's samples each group keeps, in sample order; a job per slice
(`select_samples`) then writes each group's exclusions. So a fraction keeps **exactly** round(fraction x scored)
samples (a sample with no score, NaN, is never kept), and every sample kept scores at least every sample left
out, but for those in the one bin at the threshold, of which the earliest are kept. The same at any number of
groups or parts; memory is a group's scores in the map jobs and at most 2**KEY_BITS bins in the merge.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pandas as pd

from shardsmith.core.atomic import atomic_write_text
from shardsmith.core.errors import ConfigError
from shardsmith.core.ledger import EXCLUSION_COLUMNS, SELECT
from shardsmith.embed.stats import read_npz, score_columns, write_npz
from shardsmith.formats.tables import ParquetAppender

KEY_BITS = 24
MERGE_ENTRIES = 1 << 22  # histogram entries read before they are added together: ~100 MB of them
SHORT_COLUMNS = ("similarity", "image_norm", "text_norm")  # the model's score columns, by their short name


@dataclass(frozen=True)
class SelectRule:
    name: str
    column: str  # the score tables' column
    top_fraction: float | None = None
    min: float | None = None

    @classmethod
    def of(cls, rule: dict, model: str) -> SelectRule:
        """A `select` entry of the config, its column named in full (`similarity` is the model's)."""
        column = score_columns(model)[rule["column"]] if rule["column"] in SHORT_COLUMNS else rule["column"]
        if (rule.get("top_fraction") is None) == (rule.get("min") is None):
            raise ValueError(f"select {rule['name']}: give one of top_fraction and min")
        return cls(rule["name"], column, rule.get("top_fraction"), rule.get("min"))

    def as_dict(self) -> dict:
        return {"name": self.name, "column": self.column, "top_fraction": self.top_fraction, "min": self.min}

    def describe(self) -> str:
        return f"top {self.top_fraction:.4g} by {self.column}" if self.min is None else f"{self.column} >= {self.min}"


def select_rules(rules: list[dict], model: str, columns: list[str]) -> list[SelectRule]:
    """The config's `select` list checked: names unique, each column one the score tables have (`columns`)."""
    out = [SelectRule.of(r, model) for r in rules]
    names = [r.name for r in out]
    if len(set(names)) != len(names):
        raise ValueError(f"select: rule names must differ: {', '.join(names)}")
    for r in out:
        if r.column not in columns:
            raise ValueError(f"select {r.name}: no score column {r.column!r}; there are {', '.join(columns)}")
    return out


def selection_rules(config: dict) -> list[SelectRule]:
    """The validated config's `select` rules, checked against the columns embed_part writes; a ConfigError
    names what is wrong. None when `select` is unset or empty."""
    rules = config.get("select") or []
    if not rules:
        return []
    if not config["embed"]["enabled"]:
        raise ConfigError("select: the rules select by the scores embed_part computes: set embed.enabled: true")
    model = config["embed"]["model"]
    try:
        return select_rules(rules, model, list(score_columns(model).values()))
    except ValueError as e:
        raise ConfigError(str(e)) from None


def sort_keys(values: np.ndarray) -> np.ndarray:
    """float32 scores as unsigned integers in the same order (the top KEY_BITS bits: a histogram bin)."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    keys = np.where(bits >> 31 == 1, ~bits, bits | np.uint32(0x80000000))
    return keys >> np.uint32(32 - KEY_BITS)


def bin_floor(b: int) -> float:
    """The smallest float32 in bin `b`: the threshold a fraction's cut is stated by."""
    key = np.uint32(b << (32 - KEY_BITS))
    bits = key & np.uint32(0x7FFFFFFF) if key >> 31 == 1 else ~key
    return float(np.array([bits], dtype=np.uint32).view(np.float32)[0])


def _group_scores(part_scores: list[str], rules: list[SelectRule]) -> Iterator[pd.DataFrame]:
    columns = list(dict.fromkeys(["key", *(r.column for r in rules)]))
    for path in part_scores:
        yield pd.read_parquet(path, columns=columns)


def summarize_scores(part_scores: list[str], rules: list[SelectRule], out: str) -> dict[str, int]:
    """A group's summary (`.npz`): for each fraction rule, its histogram (bins present, counts); for each rule
    the samples scored (not NaN), and for a `min` rule those at or above it. Returns the samples scored."""
    hist: dict[str, list[np.ndarray]] = {r.name: [] for r in rules}
    scored = dict.fromkeys(hist, 0)
    passing = dict.fromkeys(hist, 0)
    for frame in _group_scores(part_scores, rules):
        for r in rules:
            values = frame[r.column].to_numpy(dtype=np.float32)
            finite = values[~np.isnan(values)]
            scored[r.name] += len(finite)
            if r.min is not None:
                passing[r.name] += int((finite >= r.min).sum())
            else:
                hist[r.name].append(sort_keys(finite))
    arrays: dict[str, np.ndarray] = {}
    for r in rules:
        if r.min is None:
            keys = np.concatenate(hist[r.name]) if hist[r.name] else np.zeros(0, np.uint32)
            arrays[f"{r.name}.bins"], arrays[f"{r.name}.counts"] = np.unique(keys, return_counts=True)
        arrays[f"{r.name}.scored"] = np.array([scored[r.name]], dtype=np.int64)
        arrays[f"{r.name}.passing"] = np.array([passing[r.name]], dtype=np.int64)
    write_npz(out, **arrays)
    return scored


def kept_count(fraction: float, scored: int) -> int:
    """How many of `scored` samples a fraction keeps: round half up."""
    return min(scored, math.floor(fraction * scored + 0.5))


def _merged(pieces: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """(bins, counts) of histograms added together, bins ascending."""
    bins = np.concatenate([b for b, _ in pieces]).astype(np.int64)
    counts = np.concatenate([c for _, c in pieces]).astype(np.int64)
    merged, where = np.unique(bins, return_inverse=True)
    return merged, np.bincount(where, weights=counts, minlength=len(merged)).astype(np.int64)


def decide_selection(summaries: dict[str, str], rules: list[SelectRule], model: str, out: str) -> dict:
    """The selection (selection.json) from every group's summary ({group: path}, in group order): for each
    rule its threshold, the samples scored and kept; for a fraction rule the bin it ends in and how many of that
    bin's samples each group keeps, the earliest first. Histograms are added a few groups at a time: memory
    is at most MERGE_ENTRIES plus the bins present (2**KEY_BITS at most), whatever the samples."""
    groups = list(summaries)
    decided: dict[str, dict] = {}
    for r in rules:
        scored = passing = 0
        pieces: list[tuple[np.ndarray, np.ndarray]] = [(np.zeros(0, np.int64), np.zeros(0, np.int64))]
        for g in groups:
            s = read_npz(summaries[g])
            scored += int(s[f"{r.name}.scored"][0])
            passing += int(s[f"{r.name}.passing"][0])
            if r.min is None:
                pieces.append((s[f"{r.name}.bins"], s[f"{r.name}.counts"]))
                if sum(len(b) for b, _ in pieces) > MERGE_ENTRIES:
                    pieces = [_merged(pieces)]
        entry: dict = {"column": r.column, "model": model, "scored": scored}
        if r.min is not None:
            decided[r.name] = {**entry, "min": r.min, "threshold": r.min, "kept": passing}
            continue
        keep = kept_count(r.top_fraction, scored)
        entry |= {"top_fraction": r.top_fraction, "kept": keep}
        if keep == 0:  # nothing kept: the cut lies above every score
            decided[r.name] = {**entry, "bin": 1 << KEY_BITS, "threshold": None, "quota": {}}
            continue
        bins, counts = _merged(pieces)
        above = np.cumsum(counts[::-1])[::-1]  # above[i]: samples in bins[i] and higher
        i = int(np.flatnonzero(above >= keep)[-1])  # the highest bin whose samples and those above reach `keep`
        b = int(bins[i])
        left = keep - (int(above[i + 1]) if i + 1 < len(above) else 0)  # of bin b's samples, the earliest kept
        quota = {}
        for g in groups:
            s = read_npz(summaries[g])
            group_bins, n = s[f"{r.name}.bins"], s[f"{r.name}.counts"]
            j = int(np.searchsorted(group_bins, b))
            here = int(n[j]) if j < len(group_bins) and group_bins[j] == b else 0
            quota[g], left = min(here, left), left - min(here, left)
        decided[r.name] = {**entry, "bin": b, "threshold": bin_floor(b), "quota": quota}
    result = {"rules": decided, "summary": summary_of(decided)}  # readers of the summary need no other key
    atomic_write_text(out, json.dumps(result, indent=1, sort_keys=True) + "\n")
    return result


def _fails(r: SelectRule, decided: dict, values: np.ndarray, group: str) -> np.ndarray:
    """Which samples (in sample order) rule `r` leaves out of the group."""
    nan = np.isnan(values)
    if r.min is not None:
        return nan | ~(values >= r.min)
    keys = sort_keys(np.where(nan, np.float32(0), values)).astype(np.int64)
    b = decided["bin"]
    fails = nan | (keys < b)
    at = np.flatnonzero(~nan & (keys == b))
    fails[at[decided["quota"].get(group, 0) :]] = True  # past the group's share of the bin at the threshold
    return fails


def _detail(r: SelectRule, decided: dict, value: float) -> str:
    if value != value:  # NaN
        return f"{r.column} has no score; kept: {r.describe()}"
    if r.min is not None:
        return f"{r.column} {value:.4f} < {r.min}"
    threshold = decided["threshold"]
    cut = "none" if threshold is None else f"from {threshold:.4f}"
    return f"{r.column} {value:.4f}; kept: the top {r.top_fraction:.4g} of {decided['scored']:,} scored ({cut})"


def select_samples(
    part_scores: list[str],
    rules: list[SelectRule],
    selection: dict,
    group: str,
    out: str,
    excluded: set[str] = frozenset(),
) -> int:
    """A group's exclusions (key, stage, reason, detail): each sample a rule leaves out, named by the first rule
    it fails, but those an earlier exclusion of the group already leaves out (`excluded`, their keys: the ledger
    names that one, so every table counts a sample once); written a part at a time. Returns the rows written."""
    decided = selection["rules"]
    with ParquetAppender(out, EXCLUSION_COLUMNS) as table:
        frames = list(_group_scores(part_scores, rules))
        masks = {}
        for r in rules:  # a fraction rule's quota counts along the whole group, not per part
            values = np.concatenate([f[r.column].to_numpy(dtype=np.float32) for f in frames]) if frames else None
            masks[r.name] = _fails(r, decided[r.name], values, group) if values is not None else None
        start = 0
        for frame in frames:
            n = len(frame)
            first = np.full(n, -1)
            for i, r in reversed(list(enumerate(rules))):  # the first rule failed wins
                first[masks[r.name][start : start + n]] = i
            if excluded:
                first[frame["key"].isin(excluded).to_numpy()] = -1
            out_rows = np.flatnonzero(first >= 0)
            reasons = np.empty(len(out_rows), dtype=object)
            details = np.empty(len(out_rows), dtype=object)
            for i, r in enumerate(rules):  # a rule's rows at a time: one Python string each, their detail
                mine = first[out_rows] == i
                values = frame[r.column].to_numpy(dtype=np.float64)[out_rows[mine]].tolist()
                reasons[mine] = r.name
                details[mine] = [_detail(r, decided[r.name], v) for v in values]
            table.append(
                pd.DataFrame(
                    {"key": frame["key"].to_numpy()[out_rows], "stage": SELECT, "reason": reasons, "detail": details},
                    columns=EXCLUSION_COLUMNS,
                )
            )
            start += n
    return table.rows


def summary_of(decided: dict) -> dict:
    """What the card and build.json state of a selection: per rule, its column and model, the fraction asked
    (or the minimum), the threshold, the samples scored and kept and the fraction obtained."""
    out = {}
    for name, d in decided.items():
        out[name] = {
            k: d[k] for k in ("column", "model", "threshold", "scored", "kept", "top_fraction", "min") if k in d
        }
        out[name]["fraction_kept"] = round(d["kept"] / d["scored"], 6) if d["scored"] else None
    return out
