"""Process one part: caption normalization and image resize, from the raw cache to a processed part tar.

Each record either becomes a sample (jpg + txt + json, written in record order) with a row in the
part's samples table, or a row in the part's rejection table. Images are processed in a thread pool:
Pillow releases the GIL while decoding, resizing and encoding.
"""

import hashlib
import json
import os
import tarfile
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import pandas as pd

from shardsmith.captions import CaptionSettings, pick_caption
from shardsmith.errors import REJECT_COLUMNS, Rejection
from shardsmith.logs import ProgressLog
from shardsmith.resize import ImageResult, ResizeSettings, process_image
from shardsmith.tario import ShardWriter, atomic_open

SAMPLE_COLUMNS = [
    "key", "source", "source_id", "url", "width_before", "height_before", "width", "height",
    "bytes", "sha256", "caption_length", "caption_field", "passthrough",
    "jpg_offset", "jpg_size", "txt_offset", "txt_size", "json_offset", "json_size",
]  # fmt: skip


def _iter_raw(raw_tar: str) -> Iterator[tuple[int, bytes, dict]]:
    """(rid, image bytes, source fields) for every fetched record of a raw part tar, in record order.

    Downloads write members as they arrive; the headers are read first (tarfile seeks over the data), then
    each record's members in rid order, so the output never depends on arrival order.
    """
    where: dict[int, dict[str, tuple[int, int]]] = {}
    with tarfile.open(raw_tar, mode="r:") as tar:
        for info in tar:
            key, ext = info.name.split(".", 1)
            where.setdefault(int(key[1:]), {})[ext] = (info.offset_data, info.size)
    with open(raw_tar, "rb") as f:
        for rid in sorted(where):
            members = where[rid]
            if "img" not in members or "meta" not in members:
                continue
            data = {}
            for ext in ("img", "meta"):
                f.seek(members[ext][0])
                data[ext] = f.read(members[ext][1])
            yield rid, data["img"], json.loads(data["meta"])


def _transform(
    item: tuple[int, bytes, dict], resize: ResizeSettings, captions: CaptionSettings
) -> tuple[int, ImageResult | Rejection, str, str, dict]:
    rid, data, fields = item
    try:
        caption, field = pick_caption(fields, captions)
        return rid, process_image(data, resize), caption, field, fields
    except Rejection as r:
        return rid, r, "", "", fields


def sample_json(status: dict, result: ImageResult, caption_field: str, fields: dict) -> bytes:
    """The sample's `json`: where it came from, sizes, and the original source fields."""
    meta = {
        "key": status["key"],
        "source": status["source"],
        "source_id": status["source_id"],
        "url": status["url"],
        "caption_field": caption_field,
        "original_width": result.orig_width,
        "original_height": result.orig_height,
        "width": result.width,
        "height": result.height,
        "fields": fields,
    }
    return json.dumps(meta, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _in_order(pool: ThreadPoolExecutor, fn: Callable, items: Iterator, window: int) -> Iterator:
    """fn over items in the pool, results in input order, at most `window` items in flight.

    A sliding window rather than pool.map over batches: no barrier at each batch's slowest image, and memory
    is bounded by `window` raw images (large PNGs are tens of MB each), whatever the part size.
    """
    pending: deque = deque()
    for item in items:
        pending.append(pool.submit(fn, item))
        if len(pending) >= window:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


def process_part(
    raw_tar: str,
    status_path: str,
    out_tar: str,
    out_samples: str,
    out_rejected: str,
    resize: ResizeSettings,
    captions: CaptionSettings,
    threads: int = 1,
) -> tuple[int, int]:
    """Write the processed part; returns (samples, rejections)."""
    status = pd.read_parquet(status_path)
    by_rid = {row["rid"]: row for row in status.to_dict("records")}
    rejected = [
        {**{c: row[c] for c in ("source", "source_id", "url", "key")}, "stage": "download", "reason": row["reason"], "detail": row["detail"]}
        for row in by_rid.values()
        if row["status"] != "ok"
    ]
    samples = []
    seen: dict[str, str] = {}
    read: set[int] = set()
    failed_downloads = len(rejected)
    progress = ProgressLog(f"process {os.path.basename(out_tar).split('.')[0]}", total=len(status) - failed_downloads)
    # one thread more than the job's cores: the GIL-bound steps (parsing headers, writing the tar) of one
    # image then overlap the codec work of the others (measured: 5% faster on 2 cores)
    with atomic_open(out_tar) as f, ShardWriter(f) as tar, ThreadPoolExecutor(max(1, threads) + 1) as pool:
        transform = partial(_transform, resize=resize, captions=captions)
        for rid, result, caption, field, fields in _in_order(pool, transform, _iter_raw(raw_tar), 4 * max(1, threads)):
            progress.update(1, samples=len(samples), rejected=len(rejected) - failed_downloads)
            row = by_rid[rid]
            read.add(rid)
            if not isinstance(result, Rejection) and row["key"] in seen:
                result = Rejection("process", "duplicate_key", f"same key as {seen[row['key']]}")
            if isinstance(result, Rejection):
                rejected.append(
                    {**{c: row[c] for c in ("source", "source_id", "url", "key")}, "stage": result.stage, "reason": result.reason, "detail": result.detail}
                )
                continue
            seen[row["key"]] = row["source_id"]
            txt = caption.encode("utf-8")
            where = tar.write(row["key"], {"jpg": result.data, "txt": txt, "json": sample_json(row, result, field, fields)})
            samples.append(
                {
                    "key": row["key"], "source": row["source"], "source_id": row["source_id"], "url": row["url"],
                    "width_before": result.orig_width, "height_before": result.orig_height,
                    "width": result.width, "height": result.height, "bytes": len(result.data),
                    "sha256": hashlib.sha256(result.data).hexdigest(), "caption_length": len(caption),
                    "caption_field": field, "passthrough": result.passthrough,
                    **{f"{ext}_{n}": v for ext, (off, size) in where.items() for n, v in (("offset", off), ("size", size))},
                }
            )  # fmt: skip
    for rid, row in by_rid.items():  # "ok" in the status but not in the raw tar: a damaged raw cache
        if row["status"] == "ok" and rid not in read:
            detail = "downloaded, but its bytes are missing from the raw tar; rerun download_part for this part"
            rejected.append({**{c: row[c] for c in ("source", "source_id", "url", "key")}, "stage": "process", "reason": "missing_raw", "detail": detail})
    progress.finish(samples=len(samples), rejected=len(rejected) - failed_downloads)
    with atomic_open(out_samples) as f:
        pd.DataFrame(samples, columns=SAMPLE_COLUMNS).to_parquet(f, index=False)
    with atomic_open(out_rejected) as f:
        pd.DataFrame(rejected, columns=REJECT_COLUMNS).to_parquet(f, index=False)
    return len(samples), len(rejected)
