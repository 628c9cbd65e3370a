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
from shardsmith.embed.stats import head_columns, read_npz, score_columns, write_npz
from shardsmith.formats.tables import ParquetAppender

KEY_BITS = 24
MERGE_ENTRIES = 1 << 22  # histogram entries read before they are added together: ~100 MB of them


@dataclass(frozen=True)
class SelectRule:
    name: str
    column: str  # the score tables' column
    top_fraction: float | None = None
    min: float | None = None
    max: float | None = None
    manifest: bool = False  # the column is a manifest column the records carry, not a score table's

    @property
    def bound(self) -> bool:
        """Whether the rule keeps by a value (min or max) rather than by a fraction."""
        return self.top_fraction is None

    @classmethod
    def of(cls, rule: dict, model: str, heads: dict[str, str] | None = None) -> SelectRule:
        """A `select` entry of the config, its column named in full (`similarity` is the model's, `aesthetic` the
        score head's of that name: `heads`, {name: column})."""
        if (rule.get("column") is None) == (rule.get("manifest_column") is None):
            raise ValueError(f"select {rule['name']}: give one of column (a score) and manifest_column")
        if sum(rule.get(k) is not None for k in ("top_fraction", "min", "max")) != 1:
            raise ValueError(f"select {rule['name']}: give one of top_fraction, min and max")
        limits = (rule.get("top_fraction"), rule.get("min"), rule.get("max"))
        if rule.get("manifest_column") is not None:
            return cls(rule["name"], rule["manifest_column"], *limits, manifest=True)
        column = {**score_columns(model), **(heads or {})}.get(rule["column"], rule["column"])
        return cls(rule["name"], column, *limits)

    def as_dict(self) -> dict:
        limits = {k: getattr(self, k) for k in ("top_fraction", "min", "max")}
        return {
            "name": self.name,
            "column": self.column,
            **{k: v for k, v in limits.items() if v is not None},
            **({"manifest": True} if self.manifest else {}),
        }

    def passes(self, values: np.ndarray) -> np.ndarray:
        """Which scores a min or max rule keeps (NaN never)."""
        return values >= self.min if self.min is not None else values <= self.max

    def describe(self) -> str:
        if self.top_fraction is not None:
            return f"top {self.top_fraction:.4g} by {self.column}"
        return f"{self.column} >= {self.min}" if self.min is not None else f"{self.column} <= {self.max}"


def select_rules(
    rules: list[dict], model: str, columns: list[str], heads: dict[str, str] | None = None
) -> list[SelectRule]:
    """The config's `select` list checked: names unique, each column one the score tables have (`columns`)."""
    out = [SelectRule.of(r, model, heads) for r in rules]
    names = [r.name for r in out]
    if len(set(names)) != len(names):
        raise ValueError(f"select: rule names must differ: {', '.join(names)}")
    for r in out:
        if not r.manifest and r.column not in columns:
            raise ValueError(f"select {r.name}: no score column {r.column!r}; there are {', '.join(columns)}")
    return out


def selection_rules(config: dict) -> list[SelectRule]:
    """The validated config's `select` rules, checked against the columns embed_part writes; a ConfigError
    names what is wrong. None when `select` is unset or empty."""
    rules = config.get("select") or []
    if not rules:
        return []
    scored = [r["name"] for r in rules if r.get("manifest_column") is None]
    if scored and not config["embed"]["enabled"]:
        raise ConfigError(
            f"select {scored[0]}: selects by a score embed_part computes: set embed.enabled: true "
            "(or select by a manifest column: manifest_column)"
        )
    by_manifest = [r for r in rules if r.get("manifest_column") is not None]
    others = [s for s in config.get("sources") or () if s["type"] != "manifest"]
    if by_manifest and others:
        rule, source = by_manifest[0], others[0]
        raise ConfigError(
            f"select {rule['name']}: reads manifest column {rule['manifest_column']!r}, and source "
            f"'{source['name']}' is a {source['type']} source, whose records have no manifest columns: every one "
            "of them would be left out; select by a score (column), or build that source on its own"
        )
    model = config["embed"]["model"]
    heads = head_columns(config["embed"].get("heads"))
    try:
        return select_rules(rules, model, [*score_columns(model).values(), *heads.values()], heads)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def manifest_columns(config: dict) -> list[str]:
    """The manifest columns the selection reads: every manifest must have them (plan_parts checks, before
    anything is fetched) and its records carry them."""
    return list(dict.fromkeys(r["manifest_column"] for r in config.get("select") or () if r.get("manifest_column")))


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


def selection_reads(rules: list[SelectRule]) -> dict[str, bool]:
    """What a group's jobs read: the score tables (a rule by a score), the samples and records tables (a rule
    by a manifest column)."""
    return {"scores": any(not r.manifest for r in rules), "manifest": any(r.manifest for r in rules)}


def manifest_values(samples_path: str, records_path: str, columns: list[str]) -> pd.DataFrame:
    """key and the manifest `columns` of a part's samples, in sample order, as float32: each sample's record
    (by source_id) carries them in its fields; a value missing or no number is NaN, never kept."""
    samples = pd.read_parquet(samples_path, columns=["key", "source_id"])
    records = pd.read_parquet(records_path, columns=["source_id", "fields"])
    where = pd.Index(records["source_id"]).get_indexer(samples["source_id"])
    if (where < 0).any():
        raise KeyError(f"{records_path}: no record for {int((where < 0).sum())} samples of {samples_path}")
    fields = [json.loads(f) for f in records["fields"].to_numpy()[where]]
    out = pd.DataFrame({"key": samples["key"].to_numpy()})
    for c in columns:
        cells = [f.get(c) for f in fields]
        values = pd.to_numeric(pd.Series(cells, dtype=object), errors="coerce").to_numpy(dtype=np.float64, copy=True)
        # true/false and the text "inf" are no score: never kept, never a fraction's top
        values[~np.isfinite(values) | np.array([isinstance(v, bool) for v in cells], dtype=bool)] = np.nan
        out[c] = values.astype(np.float32)
    return out


def _group_scores(
    part_scores: list[str], rules: list[SelectRule], manifest_parts: list[tuple[str, str]] = ()
) -> Iterator[pd.DataFrame]:
    """A part's key and rule columns at a time, in sample order: the score tables' and, for manifest columns,
    each part's (samples table, records table) of `manifest_parts`, aligned with `part_scores`."""
    scored = list(dict.fromkeys(r.column for r in rules if not r.manifest))
    manifest = list(dict.fromkeys(r.column for r in rules if r.manifest))
    for i in range(len(manifest_parts) if manifest else len(part_scores)):
        if not manifest:
            yield pd.read_parquet(part_scores[i], columns=["key", *scored])
            continue
        frame = manifest_values(*manifest_parts[i], manifest)
        if scored:
            scores = pd.read_parquet(part_scores[i], columns=["key", *scored])
            if not np.array_equal(scores["key"].to_numpy(), frame["key"].to_numpy()):
                raise ValueError(f"{part_scores[i]}: its keys are not those of {manifest_parts[i][0]}")
            for c in scored:
                frame[c] = scores[c].to_numpy()
        yield frame


def summarize_scores(
    part_scores: list[str], rules: list[SelectRule], out: str, manifest_parts: list[tuple[str, str]] = ()
) -> dict[str, int]:
    """A group's summary (`.npz`): for each fraction rule, its histogram (bins present, counts); for each rule
    the samples scored (not NaN), and for a `min` or `max` rule those it keeps. Returns the samples scored."""
    hist: dict[str, list[np.ndarray]] = {r.name: [] for r in rules}
    scored = dict.fromkeys(hist, 0)
    passing = dict.fromkeys(hist, 0)
    for frame in _group_scores(part_scores, rules, manifest_parts):
        for r in rules:
            values = frame[r.column].to_numpy(dtype=np.float32)
            finite = values[~np.isnan(values)]
            scored[r.name] += len(finite)
            if r.bound:
                passing[r.name] += int(r.passes(finite).sum())
            else:
                hist[r.name].append(sort_keys(finite))
    arrays: dict[str, np.ndarray] = {}
    for r in rules:
        if not r.bound:
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
            if not r.bound:
                pieces.append((s[f"{r.name}.bins"], s[f"{r.name}.counts"]))
                if sum(len(b) for b, _ in pieces) > MERGE_ENTRIES:
                    pieces = [_merged(pieces)]
        entry: dict = {"column": r.column, "model": "manifest" if r.manifest else model, "scored": scored}
        if r.bound:
            limit = {"min": r.min} if r.min is not None else {"max": r.max}
            decided[r.name] = {**entry, **limit, "threshold": r.min if r.min is not None else r.max, "kept": passing}
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
    if r.bound:
        return nan | ~r.passes(values)
    keys = sort_keys(np.where(nan, np.float32(0), values)).astype(np.int64)
    b = decided["bin"]
    fails = nan | (keys < b)
    at = np.flatnonzero(~nan & (keys == b))
    fails[at[decided["quota"].get(group, 0) :]] = True  # past the group's share of the bin at the threshold
    return fails


def _shortest(value: float) -> str:
    """A float32 score in the fewest digits that tell it from every other float32 (0.69999, not 0.7000)."""
    return np.format_float_positional(np.float32(value), unique=True, trim="-")


def _detail(r: SelectRule, decided: dict, value: float) -> str:
    if value != value:  # NaN
        return f"{r.column} has no score; kept: {r.describe()}"
    shown = f"{value:.4f}"
    if r.min is not None:  # in full where four places round it up to the minimum
        return f"{r.column} {shown if float(shown) < r.min else _shortest(value)} < {r.min}"
    if r.max is not None:
        return f"{r.column} {shown if float(shown) > r.max else _shortest(value)} > {r.max}"
    threshold = decided["threshold"]
    if threshold is None:
        cut = "none kept"
    elif int(sort_keys(np.float32([value]))[0]) == decided["bin"]:  # as high as the kept, left out by the count
        cut = f"from {threshold:.4f}; of the scores tied there, the earliest samples"
    else:
        edge = f"{threshold:.4f}"
        if edge == shown:  # below the threshold by less than four places show: each in full
            shown, edge = _shortest(value), _shortest(threshold)
        cut = f"from {edge}"
    return f"{r.column} {shown}; kept: the top {r.top_fraction:.4g} of {decided['scored']:,} scored ({cut})"


def select_samples(
    part_scores: list[str],
    rules: list[SelectRule],
    selection: dict,
    group: str,
    out: str,
    excluded: set[str] = frozenset(),
    manifest_parts: list[tuple[str, str]] = (),
) -> int:
    """A group's exclusions (key, stage, reason, detail): each sample a rule leaves out, named by the first rule
    it fails, but those an earlier exclusion of the group already leaves out (`excluded`, their keys: the ledger
    names that one, so every table counts a sample once); written a part at a time. Returns the rows written."""
    decided = selection["rules"]
    with ParquetAppender(out, EXCLUSION_COLUMNS) as table:
        frames = list(_group_scores(part_scores, rules, manifest_parts))
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
    (or the minimum or maximum), the threshold, the samples scored and kept and the fraction obtained."""
    out = {}
    for name, d in decided.items():
        out[name] = {
            k: d[k] for k in ("column", "model", "threshold", "scored", "kept", "top_fraction", "min", "max") if k in d
        }
        out[name]["fraction_kept"] = round(d["kept"] / d["scored"], 6) if d["scored"] else None
    return out
