"""The report's plots: the funnel, image and caption distributions and CLIP scores, as PNGs (matplotlib,
Agg). matplotlib is imported only when a plot is drawn, so the summary printed at the end of a run does not pay
for it; the numbers plotted come from shardsmith.report.numbers.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from shardsmith.core.atomic import atomic_open
from shardsmith.report.numbers import (
    funnel,
    model_name,
    norm_columns,
    ordered_stages,
    random_weights,
    similarity_column,
)

if TYPE_CHECKING:
    import pandas as pd

MAX_SCATTER_POINTS = 20_000
FIGSIZE = (11, 7)
DPI = 100
BEFORE, AFTER = "#9aa5b1", "#1f6feb"  # grey for input images, blue for what is published
STAGE_COLORS = {
    "download": "#d1495b", "caption": "#edae49", "resize": "#8f5db7", "process": "#66a182",
    "embed": "#00798c", "dedupe": "#b5838d", "shard": "#2e4057",
}  # fmt: skip


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"axes.grid": True, "grid.alpha": 0.3, "axes.spines.top": False, "axes.spines.right": False})
    return plt


def save(fig, path: str) -> str:
    """Write the figure under a temporary name and rename it (no half-written plot at the final path)."""
    fmt = os.path.splitext(path)[1].lstrip(".") or "png"
    with atomic_open(path) as f:
        fig.savefig(f, format=fmt, dpi=DPI, bbox_inches="tight", metadata={"Software": None} if fmt == "png" else None)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def _sampled(n_shown: int, total: int) -> str:
    return f" (plotted: an even sample of {n_shown:,})" if total > n_shown else ""


def counts_axis(ax, which: str = "y") -> None:
    """Counts as 1,234 or 250k on an axis, never matplotlib's 1e6 offset."""

    from matplotlib.ticker import MaxNLocator

    def fmt(v: float, _pos: int) -> str:
        return f"{v / 1e6:g}M" if v >= 1e6 else f"{v / 1e3:g}k" if v >= 1e3 else f"{v:.0f}"

    axis = ax.yaxis if which == "y" else ax.xaxis
    axis.set_major_locator(MaxNLocator(integer=True))  # whole images, not 2.5 of them
    axis.set_major_formatter(fmt)


def empty(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=12, color="#666")
    ax.set_xticks([])
    ax.set_yticks([])


def plot_funnel(stats: dict, summary: dict | None, path: str, filters: Sequence[str] = ()) -> str:
    """Left: records left after each stage (`filters`: the config's filter names, in order). Right: per source,
    published and rejected by stage."""
    from matplotlib.ticker import MaxNLocator

    plt = pyplot()
    steps = funnel(stats, filters)
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
    counts_axis(ax, "x")
    ax.set_title(f"Funnel: {stats['input_records']:,} input records -> {stats['published']:,} published samples")

    sources = sorted(
        set(stats.get("published_by_source", {})) | {s for s, _ in (summary or {}).get("by_source_stage", {})}
    )
    if not sources:
        empty(ax2, "no records")
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
        counts_axis(ax2, "x")
        ax2.xaxis.set_major_locator(MaxNLocator(nbins=5, integer=True))
        ax2.legend(loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2, fontsize=9, frameon=False)
    ax2.set_title("By source")
    fig.tight_layout()
    return save(fig, path)


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


# Over 60 lines: four panels of one figure on shared bins and colours, drawn in one place to read as one.
def plot_images(manifest: pd.DataFrame, path: str, max_side: int | None = None, total: int | None = None) -> str:
    """Image sizes and aspect ratios before and after resize, JPEG bytes per image, width x height."""
    plt = pyplot()
    total = len(manifest) if total is None else total
    fig, axes = plt.subplots(2, 2, figsize=FIGSIZE)
    (a_side, a_aspect), (a_bytes, a_wh) = axes
    fig.suptitle(f"Published images: {total:,}{_sampled(len(manifest), total)}", fontsize=13)
    if manifest.empty:
        for ax in axes.flat:
            empty(ax, "no published images")
        return save(fig, path)
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
    counts_axis(a_side)
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
    counts_axis(a_aspect)
    a_aspect.set_title("Aspect ratio")
    a_aspect.legend(fontsize=9, loc="upper right")

    kib = manifest["bytes"] / 1024
    a_bytes.hist(kib, bins=40, color=AFTER)
    a_bytes.axvline(kib.median(), color="#222", linestyle="--", label=f"median {kib.median():.0f} KiB")
    a_bytes.set_xlabel("JPEG size per image (KiB)")
    a_bytes.set_ylabel("images")
    counts_axis(a_bytes)
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
    return save(fig, path)


def plot_captions(manifest: pd.DataFrame, path: str, max_chars: int | None = None, total: int | None = None) -> str:
    """Caption length in characters, stacked by source."""
    plt = pyplot()
    total = len(manifest) if total is None else total
    fig, ax = plt.subplots(figsize=(FIGSIZE[0], FIGSIZE[1] * 0.7))
    if manifest.empty:
        empty(ax, "no published captions")
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
        counts_axis(ax)
    ax.set_title(f"Caption length: {total:,} published captions{_sampled(len(manifest), total)}")
    fig.tight_layout()
    return save(fig, path)


LIMITS = {"top_fraction": "top", "min": "min", "max": "max"}  # a `select` rule's limit, as its cut's label says it


def plot_embeddings(
    scores: pd.DataFrame, emb_stats: dict, path: str, total: int | None = None, selection: dict | None = None
) -> str:
    """CLIP image-text cosine similarity, and the image and text embedding norms; each `select` rule's cut
    (`selection`: selection.json's summary) marked on its column's histogram."""
    plt = pyplot()
    total = len(scores) if total is None else total
    named = emb_stats.get("columns", {}) or {}
    sim = named.get("similarity") if named.get("similarity") in scores.columns else similarity_column(scores.columns)
    norms = [c for c in (named.get("image_norm"), named.get("text_norm")) if c in scores.columns] or norm_columns(
        scores.columns
    )
    heads = [(n, h["column"]) for n, h in (emb_stats.get("heads") or {}).items() if h["column"] in scores.columns]
    panels = 1 + max(1, len(norms)) + len(heads)
    width = FIGSIZE[0] * max(1.0, panels / 3)
    fig, axes = plt.subplots(1, panels, figsize=(width, FIGSIZE[1] * 0.65), squeeze=False)
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
    counts_axis(axes[0])
    axes[0].set_title(f"Image-text similarity\n{sim}", fontsize=11)
    axes[0].legend(fontsize=9, loc="upper right")
    if not norms:
        empty(axes[1], "no norm columns in the score tables")
    for ax, col in zip(axes[1:], norms):  # with no norm column, axes[1] says so and the heads come after it
        v = scores[col].dropna()
        text = "text" in col or "txt" in col
        ax.hist(v, bins=bins, color=BEFORE if text else "#66a182")
        ax.set_xlabel("L2 norm of the raw embedding")
        ax.set_ylabel("samples")
        counts_axis(ax)
        ax.set_title(f"{'Text' if text else 'Image'} embedding norm\n{col}", fontsize=11)
    head_axes = axes[1 + max(1, len(norms)) :]
    for ax, (name, col) in zip(head_axes, heads):
        ax.hist(scores[col].dropna(), bins=bins, color="#8d6a9f")
        ax.set_xlabel("the head's score")
        ax.set_ylabel("samples")
        counts_axis(ax)
        ax.set_title(f"Score head {name}\n{col}", fontsize=11)
    axis_of = {sim: axes[0], **dict(zip(norms, axes[1:])), **{col: ax for ax, (_, col) in zip(head_axes, heads)}}
    for name, rule in (selection or {}).items():
        if rule["column"] in axis_of and rule["threshold"] is not None:
            asked = next((f"{word} {rule[k]:.4g}" for k, word in LIMITS.items() if rule.get(k) is not None), "by score")
            label = f"select/{name}: {asked}, from {rule['threshold']:.4f}"
            axis_of[rule["column"]].axvline(rule["threshold"], color="#edae49", linestyle="-.", label=label)
            axis_of[rule["column"]].legend(fontsize=9, loc="upper right")
    fig.tight_layout()
    return save(fig, path)
