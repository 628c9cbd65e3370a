"""What operators look at after a build: the funnel, rejections, image and caption distributions, CLIP
scores and the shard table, as PNG plots (matplotlib, Agg) and small HTML tables for `snakemake --report`.

Plain functions on DataFrames and dicts; matplotlib is imported only by the plotting functions, so the
summary printed at the end of a run does not pay for it. Large tables are read column by column in
batches and evenly subsampled (`read_columns`), so a report on a billion-row manifest fits in memory.
"""

from __future__ import annotations

import html
import math
import os
import re
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING

import pyarrow.parquet as pq

from shardsmith.tario import atomic_open, atomic_write_text

if TYPE_CHECKING:  # imported where tables and plots need it: write_card (numbers only) starts 0.3 s sooner
    import pandas as pd

# Pipeline order of the rejection stages; stages added later (e.g. embed, dedupe) go between process and shard.
STAGE_ORDER = ("download", "caption", "resize", "process")
LAST_STAGES = ("shard",)
EXAMPLES_PER_REASON = 3
MAX_PLOT_ROWS = 1_000_000
MAX_SCATTER_POINTS = 20_000
FIGSIZE = (11, 7)
DPI = 100
BEFORE, AFTER = "#9aa5b1", "#1f6feb"  # grey for input images, blue for what is published
STAGE_COLORS = {
    "download": "#d1495b", "caption": "#edae49", "resize": "#8f5db7", "process": "#66a182",
    "embed": "#00798c", "dedupe": "#b5838d", "shard": "#2e4057",
}  # fmt: skip


# --- numbers --------------------------------------------------------------------------------------------


def ordered_stages(stages: Iterable[str]) -> list[str]:
    """Rejection stages in pipeline order; unknown stages (optional ones) before `shard`, alphabetically."""
    stages = set(stages)
    known = [s for s in STAGE_ORDER if s in stages]
    last = [s for s in LAST_STAGES if s in stages]
    return known + sorted(stages - set(known) - set(last)) + last


def funnel(stats: dict) -> list[tuple[str, int, int]]:
    """[(step, records left, records rejected at this step)] from the input records to the published samples."""
    left = int(stats["input_records"])
    steps = [("input records", left, 0)]
    by_stage = stats.get("rejected_by_stage", {})
    for stage in ordered_stages(by_stage):
        left -= int(by_stage[stage])
        steps.append((f"after {stage}", left, int(by_stage[stage])))
    if left != stats["published"]:  # index_shards refuses such a ledger; say so rather than plot a lie
        raise ValueError(f"stats do not add up: {left} records left after all stages, {stats['published']} published")
    steps.append(("published", int(stats["published"]), 0))
    return steps


def funnel_line(stats: dict) -> str:
    """`48 input -> 45 after download -> ... -> 39 published`, for the end-of-run summary."""
    parts = [f"{n} {'input' if step == 'input records' else step}" for step, n, _ in funnel(stats)]
    return " -> ".join(parts)


def read_columns(paths: str | list[str], columns: list[str], max_rows: int = MAX_PLOT_ROWS) -> tuple[pd.DataFrame, int]:
    """(rows, total row count) of some columns of one or more parquet files, evenly subsampled to max_rows.

    Read batch by batch, so memory stays bounded by max_rows whatever the size of the files.
    """
    import pandas as pd

    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    files = [pq.ParquetFile(p) for p in paths]
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
    for batch in pq.ParquetFile(rejected_path).iter_batches(columns=cols, batch_size=65536):
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


# --- plots ----------------------------------------------------------------------------------------------


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"axes.grid": True, "grid.alpha": 0.3, "axes.spines.top": False, "axes.spines.right": False})
    return plt


def _save(fig, path: str) -> str:
    """Write the figure under a temporary name and rename it (no half-written plot at the final path)."""
    fmt = os.path.splitext(path)[1].lstrip(".") or "png"
    with atomic_open(path) as f:
        fig.savefig(f, format=fmt, dpi=DPI, bbox_inches="tight", metadata={"Software": None} if fmt == "png" else None)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def _sampled(n_shown: int, total: int) -> str:
    return f" (plotted: an even sample of {n_shown:,})" if total > n_shown else ""


def _counts_axis(ax, which: str = "y") -> None:
    """Counts as 1,234 or 250k on an axis, never matplotlib's 1e6 offset."""

    from matplotlib.ticker import MaxNLocator

    def fmt(v: float, _pos: int) -> str:
        return f"{v / 1e6:g}M" if v >= 1e6 else f"{v / 1e3:g}k" if v >= 1e3 else f"{v:.0f}"

    axis = ax.yaxis if which == "y" else ax.xaxis
    axis.set_major_locator(MaxNLocator(integer=True))  # whole images, not 2.5 of them
    axis.set_major_formatter(fmt)


def _empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=12, color="#666")
    ax.set_xticks([])
    ax.set_yticks([])


def plot_funnel(stats: dict, summary: dict | None, path: str) -> str:
    """Left: records left after each stage. Right: per source, published and rejected by stage."""
    from matplotlib.ticker import MaxNLocator

    plt = _pyplot()
    steps = funnel(stats)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=FIGSIZE, gridspec_kw={"width_ratios": [3, 2]})
    labels = [s for s, _, _ in steps]
    left = [n for _, n, _ in steps]
    colors = [BEFORE] + [STAGE_COLORS.get(s.removeprefix("after "), "#888") for s in labels[1:-1]] + [AFTER]
    y = range(len(steps))[::-1]
    ax.barh(list(y), left, color=colors)
    total = max(stats["input_records"], 1)
    for yi, (_, n, dropped) in zip(y, steps):
        note = f"{n:,}  ({100 * n / total:.1f} %)" + (f"   -{dropped:,}" if dropped else "")
        ax.text(n + total * 0.01, yi, note, va="center", fontsize=10)
    ax.set_yticks(list(y), labels)
    ax.set_xlim(0, total * 1.35)
    ax.set_xlabel("records")
    _counts_axis(ax, "x")
    ax.set_title(f"Funnel: {stats['input_records']:,} input records -> {stats['published']:,} published samples")

    sources = sorted(
        set(stats.get("published_by_source", {})) | {s for s, _ in (summary or {}).get("by_source_stage", {})}
    )
    if not sources:
        _empty(ax2, "no records")
    else:
        yy = list(range(len(sources)))[::-1]
        base = [stats.get("published_by_source", {}).get(s, 0) for s in sources]
        ax2.barh(yy, base, color=AFTER, label="published")
        by = (summary or {}).get("by_source_stage", {})
        for stage in ordered_stages({st for _, st in by}):
            widths = [by.get((s, stage), 0) for s in sources]
            ax2.barh(yy, widths, left=base, color=STAGE_COLORS.get(stage, "#888"), label=f"rejected: {stage}")
            base = [b + w for b, w in zip(base, widths)]
        ax2.set_yticks(yy, sources)
        ax2.set_xlabel("records")
        _counts_axis(ax2, "x")
        ax2.xaxis.set_major_locator(MaxNLocator(nbins=5, integer=True))
        ax2.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2, fontsize=9, frameon=False)
    ax2.set_title("By source")
    fig.tight_layout()
    return _save(fig, path)


def _log_bins(values: list[pd.Series], n: int = 40):
    import numpy as np
    import pandas as pd

    vals = pd.concat([v[v > 0] for v in values])
    lo, hi = (float(vals.min()), float(vals.max())) if len(vals) else (1.0, 10.0)
    if hi <= lo:
        lo, hi = lo / 1.5, hi * 1.5
    return np.geomspace(lo, hi * 1.0001, n + 1)


def _px_ticks(axis, values: list[pd.Series]) -> None:
    """Plain pixel numbers at powers of two on a log axis (matplotlib's default 3x10^2 labels collide)."""
    import pandas as pd
    from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator

    vals = pd.concat(values)
    lo, hi = float(vals[vals > 0].min()), float(vals.max())
    ticks = [2**k for k in range(0, 20) if lo / 1.5 <= 2**k <= hi * 1.5] or [round(lo), round(hi)]
    axis.set_major_locator(FixedLocator(ticks))
    axis.set_major_formatter(lambda v, _pos: f"{v:g}")
    axis.set_minor_locator(NullLocator())
    axis.set_minor_formatter(NullFormatter())


def plot_images(manifest: pd.DataFrame, path: str, max_side: int | None = None, total: int | None = None) -> str:
    """Image sizes and aspect ratios before and after resize, JPEG bytes per image, width x height."""
    plt = _pyplot()
    total = len(manifest) if total is None else total
    fig, axes = plt.subplots(2, 2, figsize=FIGSIZE)
    (a_side, a_aspect), (a_bytes, a_wh) = axes
    fig.suptitle(f"Published images: {total:,}{_sampled(len(manifest), total)}", fontsize=13)
    if manifest.empty:
        for ax in axes.flat:
            _empty(ax, "no published images")
        return _save(fig, path)
    before = manifest[["width_before", "height_before"]].max(axis=1)
    after = manifest[["width", "height"]].max(axis=1)
    bins = _log_bins([before, after])
    a_side.hist(before, bins=bins, color=BEFORE, label="before resize")
    a_side.hist(after, bins=bins, histtype="step", linewidth=2, color=AFTER, label="after resize (published)")
    if max_side:
        a_side.axvline(max_side, color="#d1495b", linestyle="--", label=f"resize.max_side = {max_side} px")
    a_side.set_xscale("log")
    _px_ticks(a_side.xaxis, [before, after])
    a_side.set_xlabel("long side (px, log scale)")
    a_side.set_ylabel("images")
    _counts_axis(a_side)
    a_side.set_title("Image size")
    a_side.legend(fontsize=9, loc="upper right")

    ratio_before = manifest["width_before"] / manifest["height_before"]
    ratio_after = manifest["width"] / manifest["height"]
    bins = _log_bins([ratio_before, ratio_after])
    a_aspect.hist(ratio_before, bins=bins, color=BEFORE, label="before resize")
    a_aspect.hist(ratio_after, bins=bins, histtype="step", linewidth=2, color=AFTER, label="after resize")
    a_aspect.set_xscale("log")
    narrow = bins[-1] / bins[0] < 8  # common photo ratios when they fit, else powers of two
    candidates = (0.5, 0.75, 1, 1.33, 1.5, 2) if narrow else tuple(2.0**k for k in range(-6, 7))
    ticks = [t for t in candidates if bins[0] <= t <= bins[-1]]
    a_aspect.set_xticks(ticks, [f"{t:g}" if t >= 1 or narrow else f"1/{1 / t:g}" for t in ticks])
    a_aspect.minorticks_off()
    a_aspect.set_xlabel("aspect ratio width / height (log scale; >1 landscape)")
    a_aspect.set_ylabel("images")
    _counts_axis(a_aspect)
    a_aspect.set_title("Aspect ratio")
    a_aspect.legend(fontsize=9, loc="upper right")

    kib = manifest["bytes"] / 1024
    a_bytes.hist(kib, bins=40, color=AFTER)
    a_bytes.axvline(kib.median(), color="#222", linestyle="--", label=f"median {kib.median():.0f} KiB")
    a_bytes.set_xlabel("JPEG size per image (KiB)")
    a_bytes.set_ylabel("images")
    _counts_axis(a_bytes)
    a_bytes.set_title("Bytes per published image")
    a_bytes.legend(fontsize=9, loc="upper right")

    dots = manifest.iloc[:: max(1, math.ceil(len(manifest) / MAX_SCATTER_POINTS))]  # a cloud, not a million markers
    a_wh.scatter(
        dots["width_before"], dots["height_before"], s=8, alpha=0.5, color=BEFORE, label="before", rasterized=True
    )
    a_wh.scatter(dots["width"], dots["height"], s=8, alpha=0.7, color=AFTER, label="after", rasterized=True)
    a_wh.set_xscale("log")
    a_wh.set_yscale("log")
    _px_ticks(a_wh.xaxis, [manifest["width_before"], manifest["width"]])
    _px_ticks(a_wh.yaxis, [manifest["height_before"], manifest["height"]])
    a_wh.set_xlabel("width (px, log scale)")
    a_wh.set_ylabel("height (px, log scale)")
    a_wh.set_title("Width x height")
    a_wh.legend(fontsize=9, loc="upper left")
    fig.tight_layout()
    return _save(fig, path)


def plot_captions(manifest: pd.DataFrame, path: str, max_chars: int | None = None, total: int | None = None) -> str:
    """Caption length in characters, stacked by source."""
    plt = _pyplot()
    total = len(manifest) if total is None else total
    fig, ax = plt.subplots(figsize=(FIGSIZE[0], FIGSIZE[1] * 0.7))
    if manifest.empty:
        _empty(ax, "no published captions")
    else:
        lengths = manifest["caption_length"]
        sources = sorted(manifest["source"].unique())
        hi = max(int(lengths.max()), 1)
        width = max(1, math.ceil((hi + 1) / 60))  # whole characters per bin
        edges = [i * width for i in range(math.ceil((hi + 1) / width) + 1)]
        ax.hist([lengths[manifest["source"] == s] for s in sources], bins=edges, stacked=True, label=list(sources))
        ax.axvline(lengths.median(), color="#222", linestyle="--", label=f"median {lengths.median():.0f} chars")
        if max_chars and max_chars <= 1.5 * hi:  # a far-away cap would squash the histogram; it is in the label then
            ax.axvline(max_chars, color="#d1495b", linestyle=":", label=f"captions.max_chars = {max_chars}")
        elif max_chars:
            ax.plot([], [], " ", label=f"captions.max_chars = {max_chars} (off the scale)")
        ax.set_xlabel("caption length (characters, after normalization)")
        ax.set_ylabel("samples")
        ax.legend(fontsize=9, title="source", loc="upper right")
        _counts_axis(ax)
    ax.set_title(f"Caption length: {total:,} published captions{_sampled(len(manifest), total)}")
    fig.tight_layout()
    return _save(fig, path)


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


def plot_embeddings(scores: pd.DataFrame, emb_stats: dict, path: str, total: int | None = None) -> str:
    """CLIP image-text cosine similarity, and the image and text embedding norms."""
    plt = _pyplot()
    total = len(scores) if total is None else total
    named = emb_stats.get("columns", {}) or {}
    sim = named.get("similarity") if named.get("similarity") in scores.columns else similarity_column(scores.columns)
    norms = [c for c in (named.get("image_norm"), named.get("text_norm")) if c in scores.columns] or norm_columns(
        scores.columns
    )
    fig, axes = plt.subplots(1, 1 + max(1, len(norms)), figsize=FIGSIZE[0:1] + (FIGSIZE[1] * 0.65,), squeeze=False)
    axes = axes[0]
    warn = random_weights(emb_stats)
    title = f"CLIP scores of {total:,} embedded samples, model {model_name(emb_stats)}{_sampled(len(scores), total)}"
    if warn:
        title += "\nRANDOM WEIGHTS: these scores only prove the pipeline runs; they say nothing about the data"
    fig.suptitle(title, fontsize=12, color="#b00020" if warn else "black")
    bins = int(min(50, max(10, 2 * math.sqrt(max(total, 1)))))
    values = scores[sim].dropna()
    axes[0].hist(values, bins=bins, color=AFTER)
    if len(values):
        axes[0].axvline(values.median(), color="#222", linestyle="--", label=f"median {values.median():.3f}")
    threshold = emb_stats.get("min_similarity")
    if threshold is not None:
        axes[0].axvline(threshold, color="#d1495b", linestyle=":", label=f"embed.min_similarity = {threshold}")
    axes[0].set_xlabel("cosine similarity of image and caption")
    axes[0].set_ylabel("samples")
    _counts_axis(axes[0])
    axes[0].set_title(f"Image-text similarity\n{sim}", fontsize=11)
    axes[0].legend(fontsize=9, loc="upper right")
    if not norms:
        _empty(axes[1], "no norm columns in the score tables")
    for ax, col in zip(axes[1:], norms):
        v = scores[col].dropna()
        text = "text" in col or "txt" in col
        ax.hist(v, bins=bins, color=BEFORE if text else "#66a182")
        ax.set_xlabel("L2 norm of the raw embedding")
        ax.set_ylabel("samples")
        _counts_axis(ax)
        ax.set_title(f"{'Text' if text else 'Image'} embedding norm\n{col}", fontsize=11)
    fig.tight_layout()
    return _save(fig, path)


def write_html(path: str, text: str) -> str:
    atomic_write_text(path, text)
    return path
