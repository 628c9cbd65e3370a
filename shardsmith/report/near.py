"""What a person looks at to judge the near-duplicate thresholds: the distances found, and example pairs.

The sheet shows pairs side by side (the kept sample left, the one it keeps out right) at a few distances
spread over those found, the farthest last: where the farthest pairs still look like copies, the threshold
can go up; where they do not, down.
"""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
from PIL import Image, ImageDraw

from shardsmith.core.atomic import atomic_open
from shardsmith.formats.parts import member_columns
from shardsmith.formats.tario import read_at
from shardsmith.report.plots import counts_axis, empty, pyplot, save

THUMB = 160  # px, the long side of a thumbnail
LEVELS = 6  # distances shown on the sheet
PER_LEVEL = 2  # pairs per distance


def plot_distances(near: pd.DataFrame, settings: dict, path: str) -> str:
    """One histogram per signal of the distances between each sample and the kept one."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    for ax, signal, label in (
        (axes[0], "phash", "pHash distance (bits of 64)"),
        (axes[1], "embedding", "CLIP image cosine similarity"),
    ):
        values = near.loc[near["signal"] == signal, "distance"].to_numpy(dtype=float)
        limit = settings["phash_max_distance"] if signal == "phash" else settings["embedding_min_similarity"]
        if not len(values):
            empty(ax, "no pairs" if limit is not None else "off: no\nembedding_min_similarity")
        elif signal == "phash":
            ax.hist(values, bins=np.arange(-0.5, max(values.max(), limit) + 1.5, 1.0), color="#4c72b0")
        else:
            ax.hist(values, bins=30, color="#55a868")
        if limit is not None and len(values):
            ax.axvline(limit, color="#c44e52", linestyle="--", label=f"threshold {limit}")
            ax.legend(loc="upper left")
        ax.set_xlabel(label)
        ax.set_ylabel("samples")
        if len(values):
            counts_axis(ax)
    groups = near["kept_key"].nunique()
    fate = "left out" if settings["near"] == "exclude" else "kept (dedupe.near: report)"
    fig.suptitle(f"near-duplicates: {groups:,} groups, {len(near):,} samples near the kept one of their group, {fate}")
    return save(fig, path)


def pick_examples(near: pd.DataFrame, levels: int = LEVELS, per_level: int = PER_LEVEL) -> pd.DataFrame:
    """Rows at up to `levels` distances spread from the nearest to the farthest found, `per_level` each;
    only pairs whose two images are in this build (a kept sample of an earlier version has none here)."""
    here = near[near["kept_part"] != ""]
    rows = []
    for signal, g in here.groupby("signal", sort=True):
        far_last = g.sort_values("distance", ascending=signal == "phash", kind="stable")
        values = far_last["distance"].drop_duplicates().to_numpy()
        chosen = values[np.unique(np.linspace(0, len(values) - 1, min(levels, len(values))).round().astype(int))]
        for v in chosen:
            rows.append(far_last[far_last["distance"] == v].head(per_level))
    return pd.concat(rows, ignore_index=True) if rows else near.iloc[0:0]


def _thumb(tar: str, offset: int, size: int) -> Image.Image:
    with open(tar, "rb") as f:
        img = Image.open(io.BytesIO(read_at(f, offset, size))).convert("RGB")
    img.thumbnail((THUMB, THUMB))
    return img


def sheet(examples: pd.DataFrame, where: dict[str, tuple[str, int, int]], path: str) -> str:
    """A PNG of the example pairs, one per row: kept image, left-out image, the keys and their distance.
    `where` maps a key to (processed part tar, jpg offset, jpg size)."""
    pad, text = 8, 360
    height = max(1, len(examples)) * (THUMB + pad) + pad
    out = Image.new("RGB", (2 * THUMB + 3 * pad + text, height), "white")
    draw = ImageDraw.Draw(out)
    if examples.empty:
        draw.text((pad, pad), "no near-duplicate pairs", fill="#666")
    y = pad
    for r in examples.to_dict("records"):
        for col, key in enumerate((r["kept_key"], r["key"])):
            out.paste(_thumb(*where[key]), (pad + col * (THUMB + pad), y))
        how = f"pHash distance {int(r['distance'])} bits" if r["signal"] == "phash" else f"cosine {r['distance']:.4f}"
        lines = f"{how}\nkept: {r['kept_key']}\nnear: {r['key']}"
        draw.multiline_text((2 * THUMB + 3 * pad, y + 4), lines, fill="black", spacing=6)
        y += THUMB + pad
    with atomic_open(path) as f:
        out.save(f, "PNG")
    return path


def image_places(
    examples: pd.DataFrame, samples: dict[str, str], tars: dict[str, str]
) -> dict[str, tuple[str, int, int]]:
    """(tar, offset, size) of the jpg of every key on the sheet, from the parts' sample tables."""
    want: dict[str, set[str]] = {}
    for r in examples.to_dict("records"):
        want.setdefault(r["part"], set()).add(r["key"])
        want.setdefault(r["kept_part"], set()).add(r["kept_key"])
    where = {}
    for part, keys in want.items():
        t = pd.read_parquet(samples[part], columns=["key", *member_columns("jpg")])
        for row in t[t["key"].isin(keys)].to_dict("records"):
            where[row["key"]] = (tars[part], int(row["jpg_offset"]), int(row["jpg_size"]))
    return where
