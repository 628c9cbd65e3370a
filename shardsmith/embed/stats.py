"""Embedding scores after inference: exclusions, per-shard score tables, and the dataset's embedding stats.

Nothing here imports torch: these jobs only move and summarise what `shardsmith.embed.part` computed per part.
Per part (in the work folder): `{part}.parquet` (key + scores, part order), `{part}.npz` (keys and
L2-normalised fp16 image/text embeddings, same order) and `{part}.json` (provenance, timing). Shards are
cut from parts, so a shard's scores are a join of its plan with the parts it draws from.
"""

import io
import json
import os
import re
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd

from shardsmith.core.atomic import atomic_open, atomic_write_text
from shardsmith.core.errors import ConfigError
from shardsmith.core.ledger import EMBED, EXCLUSION_COLUMNS
from shardsmith.formats.tables import ParquetAppender, num_rows

STAGE = EMBED
QUANTILES = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999)
# Fixed bins, so histograms of two builds (or two datasets) compare bin for bin.
HIST_EDGES = np.round(np.linspace(-1.0, 1.0, 101), 2)
HEAD_BINS = 100
# Provenance that must agree between parts (scores from other weights or preprocessing cannot be pooled),
# and provenance that may differ (a part that fell back to the CPU): listed, and named under `mixed`.
MUST_AGREE = (
    "model",
    "pretrained",
    "checkpoint_sha256",
    "model_config_sha256",
    "preprocess",
    "tokenizer",
    "random_weights",
    "heads",
)
MAY_DIFFER = ("device", "precision", "resize_library", "image_decode", "versions")


def score_prefix(model: str) -> str:
    """DataComp-style prefix for a model's score columns: ViT-B-32 -> clip_b32, ViT-L-14 -> clip_l14."""
    name = model.split(":", 1)[-1].rstrip("/").rsplit("/", 1)[-1]
    tokens = [t for t in re.split(r"[^a-z0-9]+", name.lower()) if t]
    if tokens[:1] == ["vit"]:
        tokens = tokens[1:]
    merged: list[str] = []
    for t in tokens:  # "b", "32" -> "b32": DataComp writes the size letter and patch size together
        if merged and t.isdigit() and merged[-1].isalpha():
            merged[-1] += t
        else:
            merged.append(t)
    prefix = "_".join(merged) or "model"
    return prefix if "clip" in prefix else f"clip_{prefix}"


def score_columns(model: str) -> dict[str, str]:
    """Column names of the scores: cosine similarity (as DataComp names it) and both embedding norms."""
    p = score_prefix(model)
    return {"similarity": f"{p}_similarity_score", "image_norm": f"{p}_image_norm", "text_norm": f"{p}_text_norm"}


def head_column(name: str) -> str:
    """The score column of the score head `name` (embed.heads): aesthetic -> aesthetic_score."""
    return f"{name}_score"


def check_heads(config: dict) -> None:
    """`embed.heads` checked when the workflow reads its config, not after every download: heads need the
    embedding pass, names differ, and each weights file is there (what is in it, embed_part checks)."""
    heads = config["embed"].get("heads") or []
    if heads and not config["embed"]["enabled"]:
        raise ConfigError(
            f"embed.heads {heads[0]['name']}: a score head scores the image embeddings embed_part computes; set "
            "embed.enabled: true, or remove embed.heads"
        )
    head_columns(heads)
    model = config["embed"].get("model")
    scores = score_columns(model) if model else {}
    for h in heads:
        # select names a score by the head's name or the model's score's: one name must not mean both
        if h["name"] in scores or head_column(h["name"]) in scores.values():
            raise ConfigError(
                f"embed.heads {h['name']}: {model}'s own scores are named so ({', '.join(scores)}; columns "
                f"{', '.join(scores.values())}), and select would read one name as both; name the head otherwise"
            )
        if not os.path.isfile(h["weights"]):
            raise ConfigError(f"embed.heads {h['name']}: no such file {h['weights']}")


def head_columns(heads: list[dict] | tuple | None) -> dict[str, str]:
    """{name: column} of the `embed.heads` entries, in order; names must differ."""
    names = [h["name"] for h in heads or ()]
    if len(set(names)) != len(names):
        raise ConfigError(f"embed.heads: head names must differ: {', '.join(names)}")
    return {n: head_column(n) for n in names}


def write_npz(path: str | os.PathLike, **arrays: np.ndarray) -> None:
    """An uncompressed .npz (np.load reads it) with fixed zip timestamps, so the same arrays give the same bytes."""
    with atomic_open(path) as f, zipfile.ZipFile(f, "w", zipfile.ZIP_STORED) as z:
        for name, arr in arrays.items():
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.ascontiguousarray(arr), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            z.writestr(info, buf.getvalue())


def read_npz(path: str | os.PathLike) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def low_similarity_exclusions(part_scores: list[str], model: str, min_similarity: float | None) -> pd.DataFrame:
    """Exclusion rows (key, stage, reason, detail) for samples scoring below min_similarity; none when unset."""
    frames = list(_low_similarity(part_scores, model, min_similarity))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=EXCLUSION_COLUMNS)


def _low_similarity(part_scores: list[str], model: str, min_similarity: float | None) -> Iterator[pd.DataFrame]:
    """A part's exclusion rows at a time, built by column (no Python object per row but its detail text)."""
    if min_similarity is None:
        return
    col = score_columns(model)["similarity"]
    for path in part_scores:
        scores = pd.read_parquet(path, columns=["key", col])
        low = scores[scores[col] < min_similarity]
        detail = [f"{col} {s:.4f} < min_similarity {min_similarity}" for s in low[col].tolist()]
        yield pd.DataFrame(
            {"key": low["key"].to_numpy(), "stage": STAGE, "reason": "low_similarity", "detail": detail},
            columns=EXCLUSION_COLUMNS,
        )


def exclude_low_similarity(part_scores: list[str], model: str, min_similarity: float | None, out: str) -> int:
    """The exclusion table, written a part at a time: memory follows a part, not the samples left out."""
    with ParquetAppender(out, EXCLUSION_COLUMNS) as table:
        for frame in _low_similarity(part_scores, model, min_similarity):
            table.append(frame)
    return table.rows


def _part_id(path: str) -> str:
    return Path(path).name.split(".")[0]


def _shard_rows(plan_path: str, part_files: list[str], suffix: str) -> tuple[pd.DataFrame, dict[str, str]]:
    plan = pd.read_parquet(plan_path, columns=["key", "part"])
    by_part = {_part_id(p): p for p in part_files if p.endswith(suffix)}
    missing = sorted(set(plan["part"]) - set(by_part))
    if missing:
        raise FileNotFoundError(f"{plan_path}: no embeddings given for parts {', '.join(missing)}")
    return plan, by_part


def shard_scores(plan_path: str, part_scores: list[str]) -> pd.DataFrame:
    """The shard's scores, one row per planned sample, in shard order."""
    plan, by_part = _shard_rows(plan_path, part_scores, ".parquet")
    frames = []
    for part, rows in plan.groupby("part", sort=False):  # a key may repeat across parts: take it from its own part
        scores = pd.read_parquet(by_part[part])
        where = pd.Index(scores["key"]).get_indexer(rows["key"])
        if (where < 0).any():
            raise KeyError(f"{by_part[part]}: no scores for {int((where < 0).sum())} planned samples")
        frames.append(scores.iloc[where].set_axis(rows.index))
    return pd.concat(frames).sort_index().reset_index(drop=True)


def shard_embeddings(plan_path: str, part_embeddings: list[str]) -> dict[str, np.ndarray]:
    """{key, image, text} arrays of the shard's samples, in shard order."""
    plan, by_part = _shard_rows(plan_path, part_embeddings, ".npz")
    out: dict[str, np.ndarray] = {"key": plan["key"].to_numpy(dtype=str)}
    for part, rows in plan.groupby("part", sort=False):
        arrays = read_npz(by_part[part])
        where = pd.Index(arrays["key"]).get_indexer(rows["key"])
        if (where < 0).any():
            raise KeyError(f"{by_part[part]}: no embeddings for {int((where < 0).sum())} planned samples")
        for name in ("image", "text"):
            if name not in out:
                out[name] = np.zeros((len(plan), arrays[name].shape[1]), dtype=arrays[name].dtype)
            out[name][rows.index.to_numpy()] = arrays[name][where]
    return out


def write_shard_scores(
    plan_path: str, part_scores: list[str], part_embeddings: list[str], out_scores: str, out_sums: str
) -> int:
    """Write the shard's score table, and beside it (work folder) the sums that make dataset means exact."""
    scores = shard_scores(plan_path, part_scores)
    emb = shard_embeddings(plan_path, part_embeddings)
    if list(emb["key"]) != list(scores["key"]):
        raise ValueError(f"{plan_path}: scores and embeddings of the parts disagree on the samples")
    with atomic_open(out_scores) as f:
        scores.to_parquet(f, index=False)
    sums = {
        "shard": Path(out_scores).name,
        "n": len(scores),
        "image_sum": emb["image"].astype(np.float64).sum(axis=0).tolist(),
        "text_sum": emb["text"].astype(np.float64).sum(axis=0).tolist(),
    }
    atomic_write_text(out_sums, json.dumps(sums) + "\n")
    return len(scores)


def write_shard_embeddings(plan_path: str, part_embeddings: list[str], out_npz: str) -> int:
    emb = shard_embeddings(plan_path, part_embeddings)
    write_npz(out_npz, **emb)
    return len(emb["key"])


def describe(values: np.ndarray) -> dict:
    """Mean, std (population), min, max and quantiles (numpy's linear method) of a 1-d array."""
    v = np.asarray(values, dtype=np.float64)
    if not len(v):
        return {"n": 0}
    return {
        "n": len(v),
        "mean": float(v.mean()),
        "std": float(v.std()),
        "min": float(v.min()),
        "max": float(v.max()),
        "quantiles": {f"{q:g}": float(x) for q, x in zip(QUANTILES, np.quantile(v, QUANTILES))},
    }


def head_stats(scores: pd.DataFrame, heads: list[dict]) -> dict:
    """Each score head's published scores described, with a histogram of HEAD_BINS bins between their least and
    greatest (a head's range is its own: about 1 to 10 for LAION's aesthetic predictor, 0 to 1 for NSFW)."""
    out = {}
    for head in heads:
        values = scores[head["column"]].to_numpy(np.float64)
        values = values[np.isfinite(values)]
        low, high = (float(values.min()), float(values.max())) if len(values) else (0.0, 1.0)
        counts, edges = np.histogram(values, bins=HEAD_BINS, range=(low, high if high > low else low + 1))
        out[head["name"]] = {
            "column": head["column"],
            "kind": head["kind"],
            **describe(values),
            "histogram": {"edges": edges.tolist(), "counts": counts.tolist()},
        }
    return out


def merge_provenance(infos: list[dict]) -> dict:
    """One provenance for the dataset: weights and preprocessing must agree across parts; devices may differ."""
    if not infos:
        return {}
    first = infos[0]["provenance"]
    for info in infos[1:]:
        prov = info["provenance"]
        for key in MUST_AGREE:
            if prov.get(key) != first.get(key):
                raise ValueError(
                    f"parts {infos[0]['part']} and {info['part']} were embedded with different {key}: "
                    f"{first.get(key)!r} vs {prov.get(key)!r}; rerun the embedding of the older parts"
                )
    merged, mixed = dict(first), []
    for key in MAY_DIFFER:
        values = [json.dumps(i["provenance"].get(key), sort_keys=True) for i in infos]
        distinct = [json.loads(v) for v in dict.fromkeys(sorted(values))]
        merged[key] = distinct[0] if len(distinct) == 1 else distinct
        if len(distinct) > 1:
            mixed.append(key)
    merged["mixed"] = mixed  # [] says every part was embedded the same way
    return merged


def _read_shards(
    scores_paths: list[str], sums_paths: list[str], embeddings_paths: list[str]
) -> tuple[list[pd.DataFrame], list[dict]]:
    """The shards' score tables and sums; each shard's embeddings must hold the keys of its score table."""
    tables = [pd.read_parquet(p) for p in scores_paths]
    sums = [json.loads(Path(p).read_text()) for p in sums_paths]
    for path, table in zip(embeddings_paths, tables, strict=False):
        keys = read_npz(path)["key"]
        if list(keys) != list(table["key"]):
            raise ValueError(f"{path}: keys differ from the shard's score table")
    return tables, sums


def summarize(
    shard_scores_paths: list[str],
    shard_sums_paths: list[str],
    part_infos: list[str],
    model: str,
    exclusions: list[str] = (),
    min_similarity: float | None = None,
    shard_embeddings_paths: list[str] = (),
    resize: dict | None = None,
    selected_out: list[str] | None = None,
) -> dict:
    """Dataset-level embedding stats over the published samples (the shards' score tables).

    `resize` is the workflow's own resize config: the images were shrunk and re-encoded before open_clip's
    preprocessing saw them, which changes scores too, so it belongs to the provenance.
    """
    cols = score_columns(model)
    tables, sums = _read_shards(shard_scores_paths, shard_sums_paths, shard_embeddings_paths)
    scores = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame(columns=["key", *cols.values()])
    n = sum(s["n"] for s in sums)
    if n != len(scores):
        raise ValueError(f"shard sums cover {n} samples but the shard score tables hold {len(scores)}")
    infos = sorted((json.loads(Path(p).read_text()) for p in part_infos), key=lambda i: i["part"])
    excluded = sum(num_rows(p) for p in exclusions)  # from the footers: one table a group of parts
    # `select`'s exclusion tables (None: no selection), which never repeat a sample of those above
    unselected = sum(num_rows(p) for p in selected_out or [])
    embedded = sum(i["samples"] for i in infos)

    def mean_vector(field: str) -> list[float]:
        total = np.sum([s[field] for s in sums], axis=0) if sums else np.zeros(0)
        return [round(float(x), 6) for x in total / max(n, 1)]

    sim = scores[cols["similarity"]].to_numpy(np.float64)
    hist, _ = np.histogram(np.clip(sim, -1.0, 1.0), bins=HIST_EDGES)
    mean_image, mean_text = mean_vector("image_sum"), mean_vector("text_sum")
    prov = merge_provenance(infos)
    if resize is not None:
        prov["images_before_embedding"] = {"resized_by": "shardsmith download_part", "resize": resize}
    return {
        "model": model,
        "columns": cols,
        "counts": {
            "embedded": embedded,
            "published": len(scores),
            "excluded_low_similarity": excluded,
            **({"excluded_by_selection": unselected} if selected_out is not None else {}),
            "not_published_other": embedded - len(scores) - excluded - unselected,  # e.g. a key seen earlier
            "parts": len(infos),
            "shards": len(tables),
        },
        "min_similarity": min_similarity,
        "similarity": {**describe(sim), "histogram": {"edges": HIST_EDGES.tolist(), "counts": hist.tolist()}},
        "image_norm": describe(scores[cols["image_norm"]].to_numpy()),
        "text_norm": describe(scores[cols["text_norm"]].to_numpy()),
        "mean_image_embedding": mean_image,
        "mean_text_embedding": mean_text,
        "mean_embedding_norms": {
            "image": round(float(np.linalg.norm(mean_image)), 6),
            "text": round(float(np.linalg.norm(mean_text)), 6),
        },
        "embeddings": (
            "cosine similarity of L2-normalised image and text embeddings; "
            "means are of the normalised embeddings; norms are of the raw ones"
        ),
        "random_weights": bool(prov.get("random_weights", False)),
        "provenance": prov,
        **({"heads": head_stats(scores, prov["heads"])} if prov.get("heads") else {}),
    }


def write_stats(out: str, **kwargs) -> dict:
    stats = summarize(**kwargs)
    atomic_write_text(out, json.dumps(stats, indent=1, sort_keys=True) + "\n")
    return stats
