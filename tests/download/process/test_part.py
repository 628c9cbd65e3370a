"""PartProcessor (shardsmith.download.process.part): images resized as they arrive, in record order whatever the
order they finish in, within a memory bound; the same part as processing the raw tar afterwards."""

import tarfile
import threading
import time

import pandas as pd
from generated import jpeg_bytes
from httpserver import Reply

from shardsmith.core.atomic import atomic_open
from shardsmith.download import commits
from shardsmith.download.part import download_part
from shardsmith.download.process.captions import CaptionSettings
from shardsmith.download.process.part import PartProcessor, process_part
from shardsmith.download.process.resize import ResizeSettings
from shardsmith.download.rawcache import encode_fields, write_raw
from shardsmith.download.sources import plan_parts
from shardsmith.formats.tario import ShardWriter
from tests.download.test_part import FAST, RESIZE


def ok_status(n: int) -> list[dict]:
    """Status rows of `n` records of source `web`, all downloaded."""
    return [
        {"key": f"web-{i}", "source": "web", "source_id": f"u{i}", "url": f"u{i}", "rid": i, "status": "ok",
         "reason": "", "detail": ""}
        for i in range(n)
    ]  # fmt: skip


def manifest_part(tmp_path, rows: list[dict]) -> tuple[str, dict]:
    path = tmp_path / "manifest.parquet"
    pd.DataFrame(rows).to_parquet(path, index=False)
    source = {"name": "web", "type": "manifest", "path": str(path), "url_column": "url"}
    [pid] = plan_parts([source], 100, tmp_path / "parts")
    return str(tmp_path / "parts" / f"{pid}.parquet"), source


def test_images_are_resized_while_the_part_still_downloads(tmp_path, http_server):
    """The fast records are processed before the slow one has even arrived."""
    s = http_server
    for i in range(3):
        s.route(f"/f{i}.jpg", Reply(body=jpeg_bytes((100 + i, 80))))
    s.route("/slow.jpg", Reply(body=jpeg_bytes(), delay=3.0))
    rows = [{"url": s.url(p), "caption": "c"} for p in ("/f0.jpg", "/f1.jpg", "/f2.jpg", "/slow.jpg")]
    records, source = manifest_part(tmp_path, rows)
    done_at: dict[int, float] = {}

    class Timed(PartProcessor):
        def _run(self, rid, *args):
            super()._run(rid, *args)
            done_at[rid] = time.monotonic()

    proc = Timed(str(tmp_path / "p.tar"), RESIZE, CaptionSettings())
    status = download_part(
        records,
        str(tmp_path / "raw.tar"),
        str(tmp_path / "st.parquet"),
        source,
        {**FAST, "read_timeout_s": 5, "request_timeout_s": 10},
        log=lambda m: None,
        processor=proc,
    )
    downloaded = time.monotonic()
    assert proc.finish(status, str(tmp_path / "s.parquet"), str(tmp_path / "r.parquet")) == (4, 0)
    slow = int(status.loc[status["url"].str.endswith("/slow.jpg"), "rid"].iloc[0])
    assert max(t for rid, t in done_at.items() if rid != slow) < downloaded - 1.0


def test_held_images_stay_within_the_memory_bound(tmp_path):
    """Beyond `hold_bytes`, a submission carries only where its image lies and is read back when its turn comes."""
    images = [jpeg_bytes((60 + i, 40)) for i in range(6)]
    raw = tmp_path / "raw.tar"
    where = []
    with atomic_open(raw) as f, ShardWriter(f) as w:
        for i, data in enumerate(images):
            where.append(w.write(f"r{i:07d}", {"img": data, "meta": b"{}"})["img"])
    gate = threading.Event()
    held = []

    class Gated(PartProcessor):
        def _run(self, rid, record, fields, data, loc, source):
            held.append(data is not None)
            gate.wait(10)
            super()._run(rid, record, fields, data, loc, source)

    proc = Gated(str(tmp_path / "p.tar"), RESIZE, CaptionSettings(), hold_bytes=len(images[0]) * 2)
    proc.read_from(raw)
    rows = ok_status(6)
    for i, data in enumerate(images):
        proc.submit(i, rows[i], {"caption": f"c{i}"}, data, where[i])
    assert proc._held <= len(images[0]) * 2
    gate.set()
    for f in proc._futures:
        f.result()
    kept = [v for row, _ in proc.results.values() for v in row.values()]
    assert not any(isinstance(v, bytes) for v in kept)  # done images are not held until finish
    assert proc.finish(pd.DataFrame(rows), str(tmp_path / "s.parquet"), str(tmp_path / "r.parquet")) == (6, 0)
    assert held.count(True) == 2 and held.count(False) == 4


def test_rejected_images_are_not_held_until_the_part_is_done(tmp_path):
    """A rejection's traceback holds the decoder's frames and the image's bytes: kept as raised, every
    rejected image of a part stayed in memory until the part finished."""
    import io
    import tracemalloc

    import numpy as np
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (900, 1200, 3), dtype=np.uint8)).save(
        buf, "JPEG", quality=95
    )
    jpeg = buf.getvalue()  # about 1.3 MB
    rows = ok_status(12)
    proc = PartProcessor(str(tmp_path / "p.tar"), ResizeSettings(max_side=512), CaptionSettings(), hold_bytes=64 << 20)
    tracemalloc.start()
    try:
        for i in range(12):
            proc.submit(i, rows[i], {"caption": f"c{i}"}, jpeg[: (1 << 20) - i])  # a new 1 MB object each, cut short
        for f in proc._futures:
            f.result()
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert all(isinstance(r, Exception) and r.reason == "truncated" for r, _ in proc.results.values())
    assert held < 4 << 20, f"{held >> 20} MiB still held after 12 rejected images of 1 MB"
    proc.finish(pd.DataFrame(rows), str(tmp_path / "s.parquet"), str(tmp_path / "r.parquet"))


def test_process_follows_record_order_whatever_order_the_raw_tar_holds(tmp_path):
    """Downloads write bodies as they arrive and images are processed as they come; the samples table (and so
    every shard) is in record order, its offsets point at each sample's own members, and a record whose
    bytes are missing from the raw tar ends in the ledger, not nowhere."""
    raw, rows = tmp_path / "raw.tar", []
    with atomic_open(raw) as f, ShardWriter(f) as w:
        for rid in (3, 0, 2):  # arrival order; rid 1 is "ok" in the status but its bytes are missing
            write_raw(w, rid, jpeg_bytes((40 + rid, 40)), encode_fields({"txt": f"c{rid}"}))
    for rid in range(4):
        rows.append(
            {
                "rid": rid,
                "source": "web",
                "source_id": f"id{rid}",
                "url": f"u{rid}",
                "key": f"web-{rid}",
                "status": "ok",
                "reason": "",
                "detail": "",
            }
        )
    pd.DataFrame(rows).to_parquet(tmp_path / "status.parquet")
    out = {k: str(tmp_path / f"p.{k}") for k in ("tar", "samples.parquet", "rejected.parquet")}
    kept, rejected = process_part(
        str(raw), str(tmp_path / "status.parquet"), out["tar"], out["samples.parquet"], out["rejected.parquet"],
        ResizeSettings(min_side=8), CaptionSettings(),
    )  # fmt: skip
    assert (kept, rejected) == (3, 1)
    samples = pd.read_parquet(out["samples.parquet"])
    assert list(samples["key"]) == ["web-0", "web-2", "web-3"]
    with tarfile.open(out["tar"]) as tar:
        at = {(i.offset_data, i.size): i.name for i in tar}
    for row in samples.to_dict("records"):
        assert [at[(row[f"{e}_offset"], row[f"{e}_size"])] for e in ("jpg", "txt", "json")] == [
            f"{row['key']}.{e}" for e in ("jpg", "txt", "json")
        ]
    assert list(samples["width_before"]) == [40, 42, 43]
    [miss] = pd.read_parquet(out["rejected.parquet"]).to_dict("records")
    assert (miss["key"], miss["stage"], miss["reason"]) == ("web-1", "process", "missing_raw")


def test_the_resize_process_commits_on_its_own_once_every_record_is_fetched(tmp_path, http_server, monkeypatch):
    """While the part downloads, results are committed right after the raw cache's commits; once every record
    is fetched (and committed), the resize process, still busy, commits every so many results by itself."""
    from shardsmith.download import rawcache
    from shardsmith.download.process import part as part_module

    s = http_server
    n = 60
    rows = [{"url": s.route(f"/{i}.jpg", Reply(body=jpeg_bytes(size=(96, 80), color=(i, 9, 9)))), "caption": f"c{i}"}
            for i in range(n)]  # fmt: skip
    records, source = manifest_part(tmp_path, rows)
    monkeypatch.setattr(rawcache, "COMMIT_RECORDS", 10)
    real = part_module.process_image
    monkeypatch.setattr(part_module, "process_image", lambda data, r, *rest: time.sleep(0.05) or real(data, r, *rest))
    processed = tmp_path / "p" / "web-000000.tar"
    processed.parent.mkdir()
    proc = PartProcessor(str(processed), RESIZE, CaptionSettings())
    raw = tmp_path / "raw" / "web-000000.tar"
    status = download_part(records, str(raw), str(raw).replace(".tar", ".status.parquet"), source,
                           {**FAST, "concurrency": 8}, processor=proc, log=lambda m: None)  # fmt: skip
    at_download_end = commits.load(processed.parent / ".keep", "web-000000")
    seen = 0 if at_download_end is None else len(at_download_end.rows)
    assert seen < n - 10  # the resize process lags behind the fetching
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        got = commits.load(processed.parent / ".keep", "web-000000")
        if got is not None and len(got.rows) > seen:
            break
        time.sleep(0.01)
    assert got is not None and len(got.rows) > seen
    proc.finish(status, str(processed).replace(".tar", ".samples.parquet"),
                str(processed).replace(".tar", ".rejected.parquet"))  # fmt: skip
    assert not (processed.parent / ".keep").exists()


def test_boxes_in_a_source_shards_json_are_found_by_a_dotted_path(tmp_path):
    """A shards source's face boxes live in each sample's json member: `blur_boxes: json.face_bboxes`."""
    rows = ok_status(3)
    proc = PartProcessor(str(tmp_path / "p.tar"), RESIZE, CaptionSettings(), blur_boxes="json.face_bboxes")
    img = jpeg_bytes((60, 45), (200, 120, 40))
    members = [
        {"txt": "a face", "json": {"face_bboxes": [[0.2, 0.2, 0.6, 0.7]]}},  # json parsed, as member_fields gives it
        {"txt": "no face", "json": '{"face_bboxes": []}'},  # json kept as text
        {"txt": "no boxes at all", "json": {"other": 1}},
    ]
    for i, fields in enumerate(members):
        proc.submit(i, rows[i], fields, img)
    assert proc.finish(pd.DataFrame(rows), str(tmp_path / "s.parquet"), str(tmp_path / "r.parquet")) == (2, 1)
    samples = pd.read_parquet(tmp_path / "s.parquet")
    assert list(samples["blurred"]) == [1, 0] and list(samples["passthrough"]) == [False, True]
    ledger = pd.read_parquet(tmp_path / "r.parquet")
    assert list(ledger["reason"]) == ["bad_boxes"] and ledger["detail"][0].startswith("boxes missing")
