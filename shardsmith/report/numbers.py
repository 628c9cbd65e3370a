"""What operators read after a build: the funnel, rejections by reason and stage, the shard table and the
embedding model's description, as numbers and small HTML tables for `snakemake --report`; the plots are in
shardsmith.report.plots.

Plain functions on DataFrames and dicts. Large tables are read column by column in batches and evenly
subsampled (`read_columns`), so a report on a billion-row manifest fits in memory.
"""

from __future__ import annotations

import html
import math
import os
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import pyarrow.parquet as pq

from shardsmith.core.atomic import atomic_write_text
from shardsmith.core.ledger import FILTER, LAST_STAGES, STAGE_ORDER
from shardsmith.formats.tables import table_files

if TYPE_CHECKING:  # imported where tables need it: write_card (numbers only) starts 0.3 s sooner
    import pandas as pd

EXAMPLES_PER_REASON = 3
MAX_PLOT_ROWS = 1_000_000


def ordered_stages(stages: Iterable[str]) -> list[str]:
    """Rejection stages in pipeline order; unknown stages (optional ones) before `shard`, alphabetically."""
    stages = set(stages)
    known = [s for s in STAGE_ORDER if s in stages]
    last = [s for s in LAST_STAGES if s in stages]
    return known + sorted(stages - set(known) - set(last)) + last


def filter_names(config: dict | None) -> list[str]:
    """The config's filters' names in its order: the order a record meets them in (the first it fails names it)."""
    from shardsmith.core.ledger import filter_name

    return [filter_name(f) for f in (config or {}).get("filters") or []]


def funnel(stats: dict, filters: Sequence[str] = ()) -> list[tuple[str, int, int]]:
    """[(step, records left, records rejected at this step)] from the input records to the published samples;
    `filters`: the config's filter names in order (filter_names), each a step in that order, one that left out
    nothing too; without them, the filters the ledger names, by name."""
    left = int(stats["input_records"])
    steps = [("input records", left, 0)]
    by_stage = stats.get("rejected_by_stage", {})
    by_reason = stats.get("rejected_by_reason", {})
    stages = ordered_stages([*by_stage, *([FILTER] if filters else [])])
    for stage in stages:
        if stage == FILTER:  # a step per filter: each is a choice of the user's, with its own count
            seen = sorted(r for r in by_reason if r.startswith(f"{FILTER}/"))
            named = list(dict.fromkeys([*(f"{FILTER}/{n}" for n in filters), *seen]))
            if sum(by_reason.get(r, 0) for r in named) == by_stage.get(stage, 0):
                for r in named:
                    left -= int(by_reason.get(r, 0))
                    steps.append((f"after {r}", left, int(by_reason.get(r, 0))))
                continue
            if stage not in by_stage:
                continue
        left -= int(by_stage[stage])
        steps.append((f"after {stage}", left, int(by_stage[stage])))
    if left != stats["published"]:  # index_shards refuses such a ledger; say so rather than plot a lie
        raise ValueError(f"stats do not add up: {left} records left after all stages, {stats['published']} published")
    steps.append(("published", int(stats["published"]), 0))
    return steps


def funnel_line(stats: dict, filters: Sequence[str] = ()) -> str:
    """`48 input -> 45 after download -> ... -> 39 published`, for the end-of-run summary."""
    parts = [f"{n} {'input' if step == 'input records' else step}" for step, n, _ in funnel(stats, filters)]
    return " -> ".join(parts)


def read_columns(paths: str | list[str], columns: list[str], max_rows: int = MAX_PLOT_ROWS) -> tuple[pd.DataFrame, int]:
    """(rows, total row count) of some columns of one or more parquet files, evenly subsampled to max_rows.

    Read batch by batch, so memory stays bounded by max_rows whatever the size of the files.
    """
    import pandas as pd

    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    files = [pq.ParquetFile(f) for p in paths for f in table_files(p)]
    total = sum(f.metadata.num_rows for f in files)
    step = max(1, math.ceil(total / max_rows))
    frames, seen = [], 0
    for f in files:
        for batch in f.iter_batches(columns=columns, batch_size=65536):
            first = (-seen) % step  # keep rows whose global index is a multiple of step
            if first < batch.num_rows:
                frames.append(batch.slice(first).to_pandas().iloc[::step])
            seen += batch.num_rows
    if not frames:
        return pd.DataFrame({c: pd.Series(dtype="float64") for c in columns}), total
    return pd.concat(frames, ignore_index=True), total


def rejection_summary(rejected_path: str, examples: int = EXAMPLES_PER_REASON) -> dict:
    """Counts by stage/reason and by (source, stage), and the first few examples of each reason."""
    by_reason: Counter = Counter()
    by_source_stage: Counter = Counter()
    first: dict[str, list[dict]] = {}
    cols = ["source", "source_id", "url", "stage", "reason", "detail"]
    batches = (b for f in table_files(rejected_path) for b in pq.ParquetFile(f).iter_batches(65536, columns=cols))
    for batch in batches:
        df = batch.to_pandas()
        df["sr"] = df["stage"] + "/" + df["reason"]
        by_reason.update(df["sr"].value_counts().to_dict())
        by_source_stage.update(df.groupby(["source", "stage"]).size().to_dict())
        for row in df.groupby("sr", sort=False).head(examples).itertuples(index=False):  # a few rows per reason
            if len(first.setdefault(row.sr, [])) < examples:
                first[row.sr].append(
                    {"source": row.source, "source_id": row.source_id, "url": row.url, "detail": row.detail}
                )
    return {"by_reason": dict(by_reason), "by_source_stage": dict(by_source_stage), "examples": first}


def rejection_table(summary: dict, input_records: int) -> pd.DataFrame:
    """One row per stage/reason, in pipeline order then by count: count, share of input, examples."""
    import pandas as pd

    stage_rank = {s: i for i, s in enumerate(ordered_stages(r.split("/", 1)[0] for r in summary["by_reason"]))}
    reasons = sorted(summary["by_reason"], key=lambda r: (stage_rank[r.split("/", 1)[0]], -summary["by_reason"][r], r))
    rows = []
    for reason in reasons:
        n = summary["by_reason"][reason]
        ex = summary["examples"].get(reason, [])
        rows.append(
            {
                "stage": reason.split("/", 1)[0],
                "reason": reason.split("/", 1)[1],
                "count": n,
                "share of input": f"{100 * n / input_records:.2f} %" if input_records else "-",
                "examples (source id: detail)": "\n".join(f"{e['source_id']}: {e['detail']}" for e in ex),
            }
        )
    columns = ["stage", "reason", "count", "share of input", "examples (source id: detail)"]
    return pd.DataFrame(rows, columns=columns)


def shard_table(infos: list[dict]) -> pd.DataFrame:
    """One row per shard (name, samples, bytes, sha256, md5) from the write_shard sidecars, and a total row."""
    import pandas as pd

    rows = [
        {
            "shard": i["shard"],
            "samples": int(i["nsamples"]),
            "bytes": int(i["filesize"]),
            "sha256": i["sha256"],
            "md5": i["md5sum"],
        }
        for i in sorted(infos, key=lambda i: i["shard"])
    ]
    table = pd.DataFrame(rows, columns=["shard", "samples", "bytes", "sha256", "md5"])
    total = {
        "shard": f"total ({len(rows)} shards)",
        "samples": int(table["samples"].sum()),
        "bytes": int(table["bytes"].sum()),
        "sha256": "",
        "md5": "",
    }
    return pd.concat([table, pd.DataFrame([total])], ignore_index=True)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError  # unreachable


def html_table(df: pd.DataFrame, title: str, intro: str = "") -> str:
    """A self-contained HTML page with one table (shown in an iframe by Snakemake's report)."""
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    body = []
    for row in df.itertuples(index=False):
        cells = []
        for value in row:
            text = html.escape(str(value)).replace("\n", "<br>")
            numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
            cells.append(f'<td class="num">{value:,}</td>' if numeric else f"<td>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (
        "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
        f"<title>{html.escape(title)}</title><style>"
        "body{font-family:system-ui,sans-serif;margin:1em;color:#222}"
        "table{border-collapse:collapse;font-size:14px}"
        "th,td{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}"
        "th{background:#eef2f6}td.num{text-align:right;font-variant-numeric:tabular-nums}"
        "td{font-family:ui-monospace,monospace;font-size:13px;word-break:break-all}"
        "</style></head><body>\n"
        f"<h2>{html.escape(title)}</h2>\n" + (f"<p>{html.escape(intro)}</p>\n" if intro else "")
        + f"<table><thead><tr>{head}</tr></thead><tbody>\n" + "\n".join(body) + "\n</tbody></table>\n</body></html>\n"
    )  # fmt: skip


def similarity_column(columns: Iterable[str]) -> str:
    """The CLIP similarity score column (DataComp style, e.g. clip_b32_similarity_score)."""
    cols = [c for c in columns if re.search(r"similarity", c)]
    if not cols:
        raise ValueError(f"no similarity column among {sorted(columns)}")
    return sorted(cols, key=lambda c: (not c.endswith("_similarity_score"), c))[0]


def norm_columns(columns: Iterable[str]) -> list[str]:
    return sorted(c for c in columns if re.search(r"norm", c) and "similarity" not in c)


def random_weights(emb_stats: dict) -> bool:
    """True when embedding_stats.json says the model had random (untrained) weights.

    The embed stage writes `random_weights` (top level and in `provenance`); a stats file without the flag
    counts as random when its weights are described as random anywhere.
    """
    prov = emb_stats.get("provenance", {}) or {}
    flags = [d["random_weights"] for d in (emb_stats, prov) if isinstance(d.get("random_weights"), bool)]
    if flags:
        return any(flags)
    text = " ".join(str(prov.get(k, "")) for k in ("pretrained", "weights_kind", "weights_statement"))
    return bool(re.search(r"random", text, re.I))


def model_name(emb_stats: dict) -> str:
    prov = emb_stats.get("provenance", {}) or {}
    model = emb_stats.get("model") or prov.get("model") or "CLIP"
    tag = prov.get("pretrained") or ""
    tag = os.path.basename(str(tag)) if "/" in str(tag) else tag  # a checkpoint path: its file name is enough
    return f"{model} / {tag}" if tag else str(model)


def write_html(path: str, text: str) -> str:
    atomic_write_text(path, text)
    return path
