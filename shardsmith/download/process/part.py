"""Process one part: caption normalization and image resize, into a processed part tar.

Each record either becomes a sample (jpg + txt + json) with a row in the part's samples table, or a row in
the part's rejection table. download_part hands each image over as it arrives (PartProcessor; in the job, inside
its resize process: shardsmith.download.process.child), so the codec works while the rest of the part downloads;
`process_part` does the same from a raw tar alone. Images are processed in a thread pool: Pillow releases the GIL
while decoding, resizing and encoding.
"""

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from shardsmith.core.atomic import atomic_open
from shardsmith.core.errors import Rejection
from shardsmith.core.ledger import DOWNLOAD, FILTER, PROCESS, REJECT_COLUMNS
from shardsmith.core.logs import ProgressLog
from shardsmith.download import commits, rawcache
from shardsmith.download.process.blur import DEFAULT_BLUR, BlurSettings, parse_boxes
from shardsmith.download.process.captions import CaptionSettings, check_caption, get_field, pick_caption
from shardsmith.download.process.language import identify
from shardsmith.download.process.processor import Processor
from shardsmith.download.process.resize import ImageResult, ResizeSettings, process_image
from shardsmith.download.rawcache import FILTERED, KEEP_DIR, iter_raw
from shardsmith.formats.index import REJECT_SCHEMA
from shardsmith.formats.parts import SAMPLE_COLUMNS, placed_columns
from shardsmith.formats.tario import ShardWriter


def sample_json(
    status: dict,
    result: ImageResult,
    caption_field: str,
    fields: dict,
    language: tuple[str, float] = ("", 0.0),
    blurred: dict | None = None,
) -> bytes:
    """The sample's `json`: where it came from, sizes, the caption's language, the original source fields, and
    for a source with blur_boxes the boxes blurred and how (`blur`)."""
    meta = {
        "key": status["key"],
        "source": status["source"],
        "source_id": status["source_id"],
        "url": status["url"],
        "caption_field": caption_field,
        "language": language[0],
        "language_score": language[1],
        "original_width": result.orig_width,
        "original_height": result.orig_height,
        "width": result.width,
        "height": result.height,
        "fields": fields,
        **({"blur": blurred} if blurred is not None else {}),
    }
    return json.dumps(meta, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


class PartProcessor(Processor):
    """Processes one part's images while its download still runs: each record handed over by `submit` is
    resized and captioned in a thread pool and written to the processed part tar as soon as it is done.

    The processed tar is in completion order; its samples table (written by `finish`) is in record order and
    holds each member's offset, which is all that shards, embedding and indexes read it by, so the published
    bytes never depend on that order. Memory is bounded: up to `hold_bytes` of submitted images are kept in
    memory, beyond that a submission carries only where the image lies in the raw tar and is read back when
    its turn comes (the page cache still has it). A key written twice (a repeated key within a part) stays
    in the tar unreferenced: `finish` keeps the first in record order, as a rerun would.

    Its results are committed as it goes (shardsmith.download.commits, in the processed folder's `.keep/`):
    a rerun after a stop hands kept records over with `reuse`, and those whose result was committed by a
    processor with the same settings are copied from the committed tar, not decoded and resized again.
    """

    def __init__(
        self,
        out_tar: str,
        resize: ResizeSettings,
        captions: CaptionSettings,
        threads: int = 1,
        hold_bytes: int = 64 << 20,
        label: str = "",
        blur_boxes: str | None = None,
        blur: BlurSettings = DEFAULT_BLUR,
    ) -> None:
        self.out_tar, self.resize, self.captions, self.hold_bytes = out_tar, resize, captions, hold_bytes
        self.blur_boxes, self.blur = blur_boxes, blur
        self._stack = contextlib.ExitStack()
        file = self._stack.enter_context(atomic_open(out_tar))
        self._tar = ShardWriter(file, unique_keys=False)
        keep, name = Path(out_tar).parent / KEEP_DIR, Path(out_tar).name.removesuffix(".tar")
        settings = {"resize": dataclasses.asdict(resize), "captions": dataclasses.asdict(captions)}
        if blur_boxes:
            settings["blur"] = {"boxes": blur_boxes, **dataclasses.asdict(blur)}
        settings = json.loads(json.dumps(settings))  # as the JSON gives it back: lists, not tuples
        old = commits.load(keep, name)
        self._old = old if old is not None and old.meta.get("settings") == settings else None
        self._reusable = {} if self._old is None else {r["rid"]: r for r in self._old.rows.to_dict("records")}
        # open now: this processor's first commit removes the stopped run's folder
        self._old_file = None
        if self._old is not None:
            self._old_file = open(self._old.data, "rb")  # noqa: SIM115 - closed with the tar, by the stack
            self._stack.callback(self._old_file.close)
        self._commits = commits.Commits(keep, name, file, self._tar, _result_table, rawcache.COMMIT_RECORDS,
                                        rawcache.COMMIT_SECONDS,
                                        meta={"settings": settings})  # fmt: skip
        # one thread more than the job's cores: the GIL-bound steps (parsing headers, writing the tar) of one
        # image then overlap the codec work of the others (measured: 5% faster on 2 cores)
        self._pool = self._stack.enter_context(ThreadPoolExecutor(max(1, threads) + 1))
        self._lock = threading.Lock()
        self._held = 0
        self._raw = None
        self._futures: list[Future] = []
        self.results: dict[int, tuple] = {}  # rid -> (samples-table fields | Rejection, {ext: (offset, size)})
        self.label = label or os.path.basename(out_tar).split(".")[0]
        self.progress = ProgressLog(f"process {self.label}")

    def read_from(self, raw_tar: str | os.PathLike) -> None:
        """The raw tar (or the temporary file it is being written to) that images not held in memory are
        read back from; it stays open until the processor is done, so a rename does not matter."""
        if self._raw is not None:
            self._raw.close()
        self._raw = open(raw_tar, "rb")  # noqa: SIM115 - closed in _close, after the last worker

    def submit(
        self,
        rid: int,
        record: dict,
        fields: dict | bytes,
        data: bytes | None = None,
        where: tuple[int, int] | None = None,
        reuse: bool = False,
    ) -> None:
        """Process one record (`record`: its key, source, source_id and url; `fields`: its source fields, or
        their JSON as the raw tar holds it); never blocks the caller.

        `where` (offset, size) in the raw tar lets the image be read back instead of held in memory (always,
        when `data` is None); the caller flushes the raw tar before handing over a location. `reuse`: the
        record's raw bytes are those a stopped run committed, so its committed result may be copied.
        """
        if data is None and where is None:
            raise ValueError(f"record {rid}: neither its bytes nor where they lie in a readable raw tar")
        source = _source_digest(fields, len(data) if data is not None else where[1])
        if reuse and self._copy_committed(rid, record, source):
            return
        if where is not None and self._raw is not None and (data is None or self._held + len(data) > self.hold_bytes):
            self._futures.append(self._pool.submit(self._run, rid, record, fields, None, where, source))
            return
        if data is None:
            raise ValueError(f"record {rid}: neither its bytes nor where they lie in a readable raw tar")
        with self._lock:
            self._held += len(data)
        self._futures.append(self._pool.submit(self._run, rid, record, fields, data, None, source))

    def _run(
        self,
        rid: int,
        record: dict,
        fields: dict | bytes,
        data: bytes | None,
        where: tuple[int, int] | None,
        source: str,
    ) -> None:
        held = 0 if data is None else len(data)
        try:
            if isinstance(fields, bytes):
                fields = json.loads(fields)
            if data is None:
                data = os.pread(self._raw.fileno(), where[1], where[0])
                if len(data) != where[1]:
                    raise OSError(f"raw tar: short read at {where[0]}")
            fetched = len(data)
            try:
                caption, field = pick_caption(fields, self.captions)
                language = identify(caption)
                check_caption(caption, *language, self.captions)
                boxes = parse_boxes(get_field(fields, self.blur_boxes)) if self.blur_boxes else None
                result = process_image(data, self.resize, boxes, self.blur)
            except Rejection as r:
                # kept as a new one: the raised one's traceback holds the decoder's frames, and with them
                # the image's bytes, until the part is done (a default-size part's job went over 1 GiB)
                with self._lock:
                    self._done(rid, record, source, Rejection(r.stage, r.reason, r.detail), None)
                return
            del data
            txt = caption.encode("utf-8")
            blurred = None if boxes is None else {"boxes": [list(b) for b in boxes], **dataclasses.asdict(self.blur)}
            members = {
                "jpg": result.data,
                "txt": txt,
                "json": sample_json(record, result, field, fields, language, blurred),
            }
            # what the samples table needs, without the image: a part's images are not held until finish
            row = {
                "width_before": result.orig_width, "height_before": result.orig_height,
                "width": result.width, "height": result.height, "bytes": len(result.data), "bytes_before": fetched,
                "sha256": hashlib.sha256(result.data).hexdigest(), "caption_length": len(caption),
                "caption_field": field, "passthrough": result.passthrough,
                "phash": result.phash, "phash_mirror": result.phash_mirror,
                "language": language[0], "language_score": language[1], "blurred": result.blurred,
            }  # fmt: skip
            with self._lock:
                self._done(rid, record, source, row, self._tar.write(record["key"], members))
        finally:
            with self._lock:
                self._held -= held
                self.progress.update(1)

    def _done(self, rid: int, record: dict, source: str, result: "dict | Rejection", placed: dict | None) -> None:
        """A record's result, committed with the next commit (the caller holds the lock); `source` says what it
        was made from (_source_digest)."""
        self.results[rid] = (result, placed)
        if isinstance(result, Rejection):
            kept = {"row": "", "placed": "", "rejection": json.dumps([result.stage, result.reason, result.detail])}
        else:
            kept = {"row": json.dumps(result), "placed": json.dumps(placed), "rejection": ""}
        self._commits.add({"rid": rid, "key": record["key"], "source": source, **kept})

    def _copy_committed(self, rid: int, record: dict, source: str) -> bool:
        """Take a committed result for this record over (its members copied from the committed tar): only one
        made from the same source fields and image size, under the same key, whose members read back whole
        and whose image has the sha256 its row names (else the record is processed again)."""
        got = self._reusable.pop(rid, None)
        if got is None or got["key"] != record["key"] or got["source"] != source:
            return False
        with self._lock:
            if got["rejection"]:
                self._done(rid, record, source, Rejection(*json.loads(got["rejection"])), None)
            else:
                old = {ext: tuple(v) for ext, v in json.loads(got["placed"]).items()}
                fd = self._old_file.fileno()
                members = {ext: os.pread(fd, size, off) for ext, (off, size) in old.items()}
                row = json.loads(got["row"])
                # the image must be the one its row's sha256 names: the shard's re-read compares images with
                # this part, not with that hash (shardsmith.shards.validate)
                if any(len(members[e]) != size for e, (_, size) in old.items()) or (
                    hashlib.sha256(members.get("jpg", b"")).hexdigest() != row.get("sha256")
                ):
                    return False
                self._done(rid, record, source, row, self._tar.write(record["key"], members))
            self.progress.update(1)
        return True

    def finish(self, status: pd.DataFrame, out_samples: str, out_rejected: str) -> tuple[int, int]:
        """Wait for every submitted image, then write the samples and rejection tables in record order and
        put the processed tar in place; returns (samples, rejections). Every status row ends in one of them."""
        for f in self._futures:
            f.result()  # an unexpected error in a worker fails the job here
        self._tar.close()
        self._close()
        samples, rejected = [], []
        seen: dict[str, str] = {}
        for row in status.sort_values("rid").to_dict("records"):
            origin = {c: row[c] for c in ("source", "source_id", "url", "key")}
            if row["status"] != "ok":
                stage = FILTER if row["status"] == FILTERED else DOWNLOAD
                rejected.append({**origin, "stage": stage, "reason": row["reason"], "detail": row["detail"]})
                continue
            got = self.results.get(row["rid"])
            if got is None:  # "ok" in the status but never handed over: a damaged raw cache
                detail = "downloaded, but its bytes are missing from the raw tar; rerun download_part for this part"
                rejected.append({**origin, "stage": PROCESS, "reason": "missing_raw", "detail": detail})
                continue
            result, placed = got
            if not isinstance(result, Rejection) and row["key"] in seen:
                result = Rejection(PROCESS, "duplicate_key", f"same key as {seen[row['key']]}")
            if isinstance(result, Rejection):
                rejected.append({**origin, "stage": result.stage, "reason": result.reason, "detail": result.detail})
                continue
            seen[row["key"]] = row["source_id"]
            samples.append(
                {
                    **{c: row[c] for c in ("key", "source", "source_id", "url")},
                    **result,
                    **placed_columns(placed),
                }
            )
        self.progress.finish(samples=len(samples), rejected=len(rejected))
        with atomic_open(out_samples) as f:
            pd.DataFrame(samples, columns=SAMPLE_COLUMNS).to_parquet(f, index=False)
        with atomic_open(out_rejected) as f:
            # with the ledger's own types: index_shards then links the file into rejected.parquet/ unread
            ledger = pa.Table.from_pandas(pd.DataFrame(rejected, columns=REJECT_COLUMNS), preserve_index=False)
            pq.write_table(ledger.replace_schema_metadata(None).cast(REJECT_SCHEMA), f)
        commits.drop(self._commits.keep, self._commits.name)
        with contextlib.suppress(OSError):  # made by a commit; left where it holds other parts' commits
            self._commits.keep.rmdir()
        return len(samples), len(rejected)

    def abort(self) -> None:
        """Stop after an error: nothing is put in place, the temporary tar is removed."""
        for f in self._futures:
            f.cancel()
        self._close(RuntimeError("aborted"))

    def commit_when_told(self, told: bool = True) -> None:
        """Commit only on `commit`, not every so many results: the download commits its raw records first and
        then tells the processor, so every committed result is of a record the rerun keeps, and is copied.
        With `told` False (every record handed over is committed by then), every so many results again."""
        every = (sys.maxsize, math.inf) if told else (rawcache.COMMIT_RECORDS, rawcache.COMMIT_SECONDS)
        with self._lock:
            self._commits.every_records, self._commits.every_s = every

    def commit(self) -> None:
        """Commit the results made so far."""
        with self._lock:
            self._commits.commit()

    def stop(self) -> int:
        """Stop on request (the job's SIGTERM): images not started are dropped, those being processed are
        finished and everything done is committed, then the temporary tar is removed as by `abort`; returns
        the results committed in all."""
        for f in self._futures:
            f.cancel()
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            self._commits.commit()
        self._close(RuntimeError("stopped"))
        return self._commits.committed

    def _close(self, error: BaseException | None = None) -> None:
        """Shut the pool down (waiting for running images), then put the tar in place (or, after an error,
        remove it), then close the raw tar."""
        try:
            if error is None:
                self._stack.close()
            else:
                self._stack.__exit__(type(error), error, None)
        finally:
            if self._raw is not None:
                self._raw.close()
                self._raw = None


def _result_table(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["rid", "key", "source", "row", "placed", "rejection"]).astype({"rid": "int64"})


def _source_digest(fields: dict | bytes, image_size: int) -> str:
    """What a result is made from, besides the image's bytes (the same raw record's): its source fields (a new
    caption in the manifest is processed again) and the image's size."""
    raw = fields if isinstance(fields, bytes) else json.dumps(fields, sort_keys=True, ensure_ascii=False).encode()
    return f"{image_size}:{hashlib.sha256(raw).hexdigest()[:32]}"


def process_part(
    raw_tar: str,
    status_path: str,
    out_tar: str,
    out_samples: str,
    out_rejected: str,
    resize: ResizeSettings,
    captions: CaptionSettings,
    threads: int = 1,
    blur_boxes: str | None = None,
    blur: BlurSettings = DEFAULT_BLUR,
) -> tuple[int, int]:
    """Process a part from its raw tar alone (download_part does the same while it downloads); returns
    (samples, rejections)."""
    status = pd.read_parquet(status_path)
    by_rid = {row["rid"]: row for row in status.to_dict("records")}
    with PartProcessor(out_tar, resize, captions, threads, blur_boxes=blur_boxes, blur=blur) as proc:
        proc.read_from(raw_tar)
        for rid, where, fields in iter_raw(raw_tar):
            if rid in by_rid and by_rid[rid]["status"] == "ok":
                proc.submit(rid, by_rid[rid], fields, where=where)
        return proc.finish(status, out_samples, out_rejected)
