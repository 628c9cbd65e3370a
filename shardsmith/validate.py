"""Validate shards the way OpenCLIP's training loader reads them, before anything is published.

"Passes validation" must mean "trains": each shard is read with OpenCLIP's own pipeline
(`tarfile_to_samples_nothrow`, `filter_no_caption_or_no_image`, `decode("pilrgb")`, `rename(...)`), and
every sample must survive it. A shard that silently loses samples there hangs training at epoch 0.
"""

import json
import re
import tarfile
from collections import Counter
from pathlib import Path

import pandas as pd

from shardsmith.tario import atomic_write_text

MEMBER_NAME = re.compile(r"^[A-Za-z0-9_-]+\.(jpg|txt|json)$")


class ValidationFailed(RuntimeError):
    pass


def _openclip_stages() -> tuple[object, object, object, str]:
    """OpenCLIP's own loader functions; webdataset's equivalents only where open_clip_train is not installed."""
    try:
        from open_clip_train.data import filter_no_caption_or_no_image, log_and_continue, tarfile_to_samples_nothrow

        return tarfile_to_samples_nothrow, filter_no_caption_or_no_image, log_and_continue, "open_clip_train.data"
    except ImportError:  # pragma: no cover - the pinned environment has it
        import webdataset as wds

        def has_pair(sample: dict) -> bool:  # same rule as open_clip_train.data.filter_no_caption_or_no_image
            return "txt" in sample and any(e in sample for e in ("png", "jpg", "jpeg", "webp"))

        return wds.tarfile_to_samples(handler=wds.warn_and_continue), has_pair, wds.warn_and_continue, "webdataset"


def read_like_openclip(url: str) -> tuple[int, list[dict], str]:
    """(sample groups in the tar, samples that survive OpenCLIP's pipeline, loader name)."""
    import webdataset as wds

    to_samples, keep, handler, loader = _openclip_stages()
    groups = sum(1 for _ in wds.DataPipeline(wds.SimpleShardList(url), to_samples))
    pipeline = wds.DataPipeline(
        wds.SimpleShardList(url),
        to_samples,
        wds.select(keep),
        wds.decode("pilrgb", handler=handler),
        wds.rename(image="jpg;png;jpeg;webp", text="txt"),
    )
    # keep what the checks need, not the decoded images: a 10,000-sample shard held decoded is ~8 GB
    ok = [{"__key__": s["__key__"], "size": s["image"].size, "mode": s["image"].mode, "text": s["text"]} for s in pipeline]
    return groups, ok, loader


def validate_shard(shard: str, plan_path: str, max_side: int | None, max_pixels: int) -> dict:
    """Problems found in one shard (an empty list when it is good)."""
    problems: list[str] = []
    name = Path(shard).name
    plan_keys = list(pd.read_parquet(plan_path, columns=["key"])["key"])
    with tarfile.open(shard, "r:") as tar:
        for info in tar.getmembers():
            if not info.isreg():
                problems.append(f"{name}: member {info.name} is not a regular file")
            elif not MEMBER_NAME.match(info.name) or len(info.name.encode()) > 100:
                problems.append(f"{name}: member name {info.name!r} is not key.(jpg|txt|json) within 100 bytes")
    groups, samples, loader = read_like_openclip(shard)
    keys = [s["__key__"] for s in samples]
    if groups != len(plan_keys):
        problems.append(f"{name}: the loader found {groups} samples, the plan has {len(plan_keys)}")
    if len(samples) != groups:
        problems.append(f"{name}: {groups - len(samples)} of {groups} samples dropped by OpenCLIP's filter/decoder")
    if keys != plan_keys[: len(keys)] or len(keys) != len(plan_keys):
        missing = sorted(set(plan_keys) - set(keys))[:5]
        problems.append(f"{name}: keys read differ from the plan (missing e.g. {missing})")
    for s in samples:
        w, h = s["size"]
        if s["mode"] != "RGB":
            problems.append(f"{name}/{s['__key__']}: image mode {s['mode']}")
        if (max_side and max(w, h) > max_side) or w * h > max_pixels:
            problems.append(f"{name}/{s['__key__']}: image {w}x{h} over the limits")
        if not isinstance(s["text"], str) or not s["text"].strip():
            problems.append(f"{name}/{s['__key__']}: empty caption")
    return {"shard": name, "loader": loader, "groups": groups, "passed": len(samples), "problems": problems}


def check_dataset(reports: list[str], sizes_path: str, manifest_path: str, min_shards: int) -> dict:
    """Combine the per-shard reports with dataset-wide checks; raise ValidationFailed with a readable report."""
    shard_reports = [json.loads(Path(p).read_text()) for p in reports]
    sizes = json.loads(Path(sizes_path).read_text())
    problems = [p for r in shard_reports for p in r["problems"]]
    for r in shard_reports:
        if sizes.get(r["shard"]) != r["passed"]:
            problems.append(f"{r['shard']}: sizes.json says {sizes.get(r['shard'])}, the loader read {r['passed']}")
    if set(sizes) != {r["shard"] for r in shard_reports}:
        problems.append("sizes.json does not list exactly the shards that were validated")
    keys = pd.read_parquet(manifest_path, columns=["key"])["key"]
    dupes = [k for k, n in Counter(keys).items() if n > 1]
    if dupes:
        problems.append(f"{len(dupes)} keys occur in more than one sample (e.g. {dupes[:3]})")
    if len(shard_reports) < min_shards:
        problems.append(
            f"{len(shard_reports)} shards, fewer than validate.min_shards={min_shards}: OpenCLIP needs at least "
            "workers x GPUs shards; lower samples_per_shard"
        )
    total = sum(r["passed"] for r in shard_reports)
    if total == 0:
        problems.append("no sample was published: every input record was rejected (see rejected.parquet)")
    summary = {
        "ok": not problems,
        "loader": shard_reports[0]["loader"] if shard_reports else None,
        "shards": len(shard_reports),
        "samples": total,
        "problems": problems,
    }
    if problems:
        shown = "\n".join(f"  - {p}" for p in problems[:50])
        more = f"\n  ... and {len(problems) - 50} more" if len(problems) > 50 else ""
        raise ValidationFailed(f"validation failed, nothing was published ({len(problems)} problems):\n{shown}{more}")
    return summary


def write_json(path: str, obj: dict) -> None:
    atomic_write_text(path, json.dumps(obj, indent=1, sort_keys=True) + "\n")
