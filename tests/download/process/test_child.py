"""Processing while downloading in a resize process of the job's own (ChildProcessor): the same part as
processing the raw tar afterwards; a failure fails the part and leaves no file behind; a stop or a kill of the
job leaves what the resize process made committed for the rerun."""

import json
import multiprocessing
import os
import signal
import tarfile
import time
from pathlib import Path

import pandas as pd
import pytest
from generated import jpeg_bytes
from httpserver import Reply

from shardsmith.core.leftovers import find_leftovers, remove_leftovers
from shardsmith.core.stopping import STOPPED_EXIT_CODE, Stopped, stop_on_sigterm
from shardsmith.download import commits
from shardsmith.download.part import download_part
from shardsmith.download.process import child
from shardsmith.download.process.captions import CaptionSettings
from shardsmith.download.process.child import ChildProcessor
from shardsmith.download.process.part import PartProcessor, process_part
from shardsmith.download.process.resize import ResizeSettings
from shardsmith.download.sources import plan_parts
from tests.download.process.test_part import manifest_part, ok_status
from tests.download.test_part import FAST, RESIZE, _samples


def members(path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar}


def serve_mix(s) -> tuple[list[dict], bytes, bytes]:
    """A passthrough JPEG, one to shrink, a truncated one and a 404, with captions; (rows, small, truncated)."""
    small, big = jpeg_bytes((40, 30)), jpeg_bytes((200, 100), (10, 200, 30))
    truncated = big[: len(big) * 2 // 3]
    s.route("/small.jpg", Reply(body=small))
    s.route("/big.jpg", Reply(body=big))
    s.route("/cut.jpg", Reply(body=truncated))
    s.route("/gone.jpg", Reply(status=404, body=b"no"))
    rows = [{"url": s.url(f"/{n}.jpg"), "caption": f"photo {n}"} for n in ("small", "big", "cut", "gone")]
    return rows, small, truncated


def test_the_child_process_gives_the_part_that_processing_the_raw_tar_gives(tmp_path, http_server):
    """Same samples table and member bytes; a passthrough JPEG is the fetched body, a truncated one is
    rejected, a failed download is in the ledger: every record ends in exactly one table."""
    rows, small, _ = serve_mix(http_server)
    records, source = manifest_part(tmp_path, rows)
    child = ChildProcessor(str(tmp_path / "child.tar"), RESIZE, CaptionSettings())
    status = download_part(
        records,
        str(tmp_path / "raw.tar"),
        str(tmp_path / "st.parquet"),
        source,
        FAST,
        log=lambda m: None,
        processor=child,
    )
    assert child.finish(status, str(tmp_path / "child.samples.parquet"), str(tmp_path / "child.rejected.parquet")) == (
        2,
        2,
    )
    again = process_part(
        str(tmp_path / "raw.tar"), str(tmp_path / "st.parquet"), str(tmp_path / "again.tar"),
        str(tmp_path / "again.samples.parquet"), str(tmp_path / "again.rejected.parquet"), RESIZE, CaptionSettings(),
    )  # fmt: skip
    assert again == (2, 2)

    def content(name: str) -> tuple[list[dict], list[dict], list]:
        samples = pd.read_parquet(tmp_path / f"{name}.samples.parquet")
        offsets = [c for c in samples if c.endswith(("_offset", "_size"))]
        tar = members(tmp_path / f"{name}.tar")
        return (
            samples.drop(columns=offsets).to_dict("records"),
            pd.read_parquet(tmp_path / f"{name}.rejected.parquet").to_dict("records"),
            [tar[f"{k}.{e}"] for k in samples["key"] for e in ("jpg", "txt", "json")],
        )

    assert content("child") == content("again")
    samples, rejected, _ = content("child")
    assert [r["passthrough"] for r in samples] == [True, False]
    key = samples[0]["key"]
    assert members(tmp_path / "child.tar")[f"{key}.jpg"] == small  # byte for byte what the server sent
    assert json.loads(members(tmp_path / "child.tar")[f"{key}.json"])["fields"]["caption"] == "photo small"
    assert sorted((r["stage"], r["reason"]) for r in rejected) == [("download", "not_found"), ("resize", "truncated")]


def test_every_message_crosses_the_pipe_as_it_was_sent():
    """The job's messages and the resize process's answers arrive with their type and every field."""
    record = {"key": "web-7", "source": "web", "source_id": "u7", "url": "https://example.com/7.jpg"}
    sent = [
        child.ReadFrom("/raw/web-000000.tar"),
        child.Submit(7, record, b'{"caption":"c"}', (1536, 4096), True),
        child.Submit(8, record, {"caption": "c"}, (0, 1), False),
        child.CommitWhenTold(False),
        child.Commit(),
        child.Stop(),
        child.Abort(),
        child.Reply((3, 1)),
        child.Reply(error="OSError: raw tar: short read"),
    ]
    ours, theirs = multiprocessing.Pipe()
    for msg in sent:
        child.send_message(ours, msg)
        got = child.receive_message(theirs)
        assert type(got) is type(msg) and got == msg
    status = pd.DataFrame(ok_status(2))
    child.send_message(ours, child.Finish(status, "s.parquet", "r.parquet"))
    got = child.receive_message(theirs)
    assert type(got) is child.Finish and (got.out_samples, got.out_rejected) == ("s.parquet", "r.parquet")
    pd.testing.assert_frame_equal(got.status, status)


def test_a_failure_in_the_child_fails_the_part_and_leaves_no_file(tmp_path):
    """An image that cannot be read back (the raw tar cut short) is an error of the job, not a lost record."""
    raw = tmp_path / "raw.tar"
    raw.write_bytes(b"\0" * 1024)
    child = ChildProcessor(str(tmp_path / "p.tar"), RESIZE, CaptionSettings())
    child.read_from(raw)
    record = {"key": "web-0", "source": "web", "source_id": "u0", "url": "u0"}
    child.submit(0, record, b"{}", where=(512, 4096))
    status = pd.DataFrame([{**record, "rid": 0, "status": "ok", "reason": "", "detail": ""}])
    with pytest.raises(RuntimeError, match="in the resize process: OSError: raw tar: short read"):
        child.finish(status, str(tmp_path / "s.parquet"), str(tmp_path / "r.parquet"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw.tar"] and find_leftovers([tmp_path]) == []


@pytest.mark.skipif(not Path("/proc/self/comm").exists(), reason="process names are read from /proc")
def test_the_resize_process_and_its_threads_are_named_for_top_and_perf(tmp_path):
    child = ChildProcessor(str(tmp_path / "c.tar"), RESIZE, CaptionSettings(), label="web-000003")
    try:
        (tmp_path / "raw.tar").write_bytes(b"")
        child.read_from(tmp_path / "raw.tar")  # answered once the child runs: named by then
        pid = child._child.pid
        names = {Path(t, "comm").read_text().strip() for t in Path(f"/proc/{pid}/task").iterdir()}
        assert names == {"resize web-0000"}  # the kernel keeps 15 bytes
    finally:
        child.abort()


def test_an_aborted_part_leaves_no_file(tmp_path):
    for proc in (
        ChildProcessor(str(tmp_path / "c.tar"), RESIZE, CaptionSettings()),
        PartProcessor(str(tmp_path / "p.tar"), RESIZE, CaptionSettings()),
    ):
        proc.abort()
    assert list(tmp_path.iterdir()) == []


def _faults_per_image(conn) -> None:
    """In a fresh process with the resize process's allocator settings: minor page faults per image over a
    second pass through web-size images of alternating sizes (a large one's freed buffer is what the next
    large one needs)."""
    import io
    import resource

    import numpy as np
    from PIL import Image

    from shardsmith.download.process.resize import process_image

    child.tune_allocator()
    rng = np.random.default_rng(0)
    images = []
    for i in range(12):
        w, h = (1400 + 10 * i, 1000) if i % 2 else (300, 200 + 10 * i)
        pixels = np.linspace(0, 255, w, dtype=np.float32)[None, :, None] + rng.normal(0, 20, (h, w, 3))
        im = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
        buf = io.BytesIO()
        im.save(buf, "JPEG", quality=80) if i % 4 < 2 else im.convert("RGBA").save(buf, "PNG", compress_level=1)
        images.append(buf.getvalue())
    del pixels, im
    settings = ResizeSettings(max_side=512)
    for data in images:  # warm: imports, the heap's first growth
        process_image(data, settings)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for data in images:
        process_image(data, settings)
    conn.send((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / len(images))


@pytest.mark.skipif(__import__("platform").libc_ver()[0] != "glibc", reason="glibc's malloc settings")
def test_the_resize_process_reuses_freed_decode_buffers():
    """Decode buffers of web-size images (a few MB) are reused by the next image, not returned to the OS
    and faulted in again page by page: that cost a fifth of the codec's time in system CPU."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")  # a fresh heap, as the resize process has
    parent, child = ctx.Pipe()
    p = ctx.Process(target=_faults_per_image, args=(child,))
    p.start()
    faults = parent.recv()
    p.join()
    # a 1400x1000 PNG decodes to 5.6 MB, about 1,400 pages of 4 KiB; with large buffers returned and
    # nothing else, this set usually costs about 700 faults an image (glibc trims the freed heap at once)
    assert faults < 50


def _part_in_child(records: str, raw_dir: str, processed: str, source: dict, every: int) -> None:
    from shardsmith.download import rawcache

    rawcache.COMMIT_RECORDS = every
    with ChildProcessor(processed, RESIZE, CaptionSettings()) as proc:
        Path(processed + ".resize-pid").write_text(str(proc.pid))
        status = download_part(records, f"{raw_dir}/web-000000.tar", f"{raw_dir}/web-000000.status.parquet", source,
                               {**FAST, "concurrency": 2}, processor=proc, log=lambda m: None)  # fmt: skip
        proc.finish(status, processed.replace(".tar", ".samples.parquet"),
                    processed.replace(".tar", ".rejected.parquet"))  # fmt: skip


def _rerun_counting_resizes(records: str, raw, processed, source: dict, monkeypatch) -> list[int]:
    """The part run again (no kill), as the rule runs it but in this process; returns a 1 per image resized."""
    from shardsmith.download.process import part as part_module

    resized = []
    real = part_module.process_image
    monkeypatch.setattr(part_module, "process_image", lambda data, r, *rest: resized.append(1) or real(data, r, *rest))
    with PartProcessor(str(processed), RESIZE, CaptionSettings()) as again:
        status = download_part(records, str(raw / "web-000000.tar"), str(raw / "web-000000.status.parquet"), source,
                               {**FAST, "concurrency": 2}, processor=again, log=lambda m: None)  # fmt: skip
        again.finish(status, str(processed).replace(".tar", ".samples.parquet"),
                     str(processed).replace(".tar", ".rejected.parquet"))  # fmt: skip
    return resized


def test_a_part_killed_while_resizing_reuses_the_committed_samples(tmp_path, http_server, monkeypatch):
    """A part killed mid-download with its child resizing: the rerun resizes no record of the child's last
    commit again, and its samples (bytes and table rows) are those of a run never killed. A committed image
    damaged since (one bit) is not taken over: its record is resized again."""
    s = http_server
    n, every = 100, 10
    imgs = [jpeg_bytes(size=(96, 80), color=(i * 2, 50, 9)) for i in range(n)]
    rows = [{"url": s.route(f"/{i}.jpg", Reply(body=imgs[i], delay=0.01)), "caption": f"photo {i}"} for i in range(n)]
    records, source = manifest_part(tmp_path, rows)
    runs = {}
    for name in ("clean", "killed"):
        raw, processed = tmp_path / name / "raw", tmp_path / name / "processed" / "web-000000.tar"
        raw.mkdir(parents=True)
        processed.parent.mkdir(parents=True)
        runs[name] = (raw, processed)
    _part_in_child(records, str(runs["clean"][0]), str(runs["clean"][1]), source, every)
    s.reset_counts()

    raw, processed = runs["killed"]
    args = (records, str(raw), str(processed), source, every)
    proc = multiprocessing.get_context("fork").Process(target=_part_in_child, args=args)
    proc.start()
    deadline = time.monotonic() + 60
    while s.total() < n * 2 // 3 and time.monotonic() < deadline and proc.is_alive():
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    # its resize process goes on with what the pipe still holds (a kill of the job alone; SLURM kills both),
    # then ends: what it committed by then is what the rerun finds
    resize_pid = int(Path(str(processed) + ".resize-pid").read_text())
    deadline = time.monotonic() + 30
    while _running(resize_pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    committed = commits.load(processed.parent / ".keep", "web-000000")
    assert committed is not None and len(committed.rows) >= every and not processed.exists()
    # the resize process commits right after the download's commits: only results of records the rerun keeps
    assert set(committed.rows["rid"]) <= set(commits.load(raw / ".keep", "web-000000").rows["rid"])
    remove_leftovers([tmp_path / "killed"])  # what the next workflow run does first: the stopped job's temporaries
    offset, _ = json.loads(committed.rows.iloc[0]["placed"])["jpg"]
    with open(committed.data, "r+b") as f:  # one committed image damaged since: one bit
        f.seek(offset + 200)
        byte = f.read(1)
        f.seek(offset + 200)
        f.write(bytes([byte[0] ^ 1]))

    resized = _rerun_counting_resizes(records, raw, processed, source, monkeypatch)
    assert len(resized) == n - len(committed.rows) + 1  # every whole committed result copied
    assert _samples(processed) == _samples(runs["clean"][1])
    assert not (processed.parent / ".keep").exists() and find_leftovers([tmp_path]) == []


def _stoppable_part_in_child(records: str, raw_dir: str, processed: str, source: dict) -> None:
    """As scripts/download_part.py runs a part: on SIGTERM the resize process is told to stop, and commits."""
    from shardsmith.download import rawcache

    rawcache.COMMIT_RECORDS = 100_000  # no commit falls due: what is committed, the stop committed
    try:
        with stop_on_sigterm(), ChildProcessor(processed, RESIZE, CaptionSettings()) as proc:
            download_part(records, f"{raw_dir}/web-000000.tar", f"{raw_dir}/web-000000.status.parquet", source,
                          {**FAST, "concurrency": 2}, processor=proc, log=lambda m: None)  # fmt: skip
    except Stopped:
        os._exit(STOPPED_EXIT_CODE)


def test_a_part_stopped_by_sigterm_commits_the_samples_its_resize_process_made(tmp_path, http_server, monkeypatch):
    """SIGTERM with the resize process busy: the job's last commit and the resize process's hold every
    record and sample done at the stop, so the rerun neither fetches nor resizes them again."""
    s = http_server
    n = 100
    imgs = [jpeg_bytes(size=(96, 80), color=(i * 2, 50, 9)) for i in range(n)]
    rows = [{"url": s.route(f"/{i}.jpg", Reply(body=imgs[i], delay=0.01)), "caption": f"photo {i}"} for i in range(n)]
    records, source = manifest_part(tmp_path, rows)
    clean, raw, processed = (
        tmp_path / "clean",
        tmp_path / "stopped" / "raw",
        tmp_path / "stopped" / "p" / "web-000000.tar",
    )
    for d in (clean / "raw", clean / "p", raw, processed.parent):
        d.mkdir(parents=True)
    _part_in_child(records, str(clean / "raw"), str(clean / "p" / "web-000000.tar"), source, 10)
    s.reset_counts()

    proc = multiprocessing.get_context("fork").Process(
        target=_stoppable_part_in_child, args=(records, str(raw), str(processed), source)
    )
    proc.start()
    deadline = time.monotonic() + 60
    while s.total() < n * 2 // 3 and time.monotonic() < deadline and proc.is_alive():
        time.sleep(0.005)
    os.kill(proc.pid, signal.SIGTERM)
    proc.join(60)
    assert proc.exitcode == STOPPED_EXIT_CODE
    fetched = commits.load(raw / ".keep", "web-000000")
    made = commits.load(processed.parent / ".keep", "web-000000")
    assert fetched is not None and made is not None and len(made.rows) >= n // 3
    assert find_leftovers([tmp_path / "stopped"]) == []  # the stop removed its temporaries itself
    before = {u["url"]: s.count(u["url"].split(str(s.port))[1]) for u in rows}

    resized = _rerun_counting_resizes(records, raw, processed, source, monkeypatch)
    again = {u for u in before if s.count(u.split(str(s.port))[1]) > before[u]}
    assert again == {u["url"] for u in rows} - set(fetched.rows["url"])
    assert set(made.rows["rid"]) <= set(fetched.rows["rid"])
    assert len(resized) == n - len(made.rows)
    assert _samples(processed) == _samples(clean / "p" / "web-000000.tar")
    assert not (processed.parent / ".keep").exists() and find_leftovers([tmp_path]) == []


def _job_with_a_resize_process(out: str, pid_file: str) -> None:
    child = ChildProcessor(out, RESIZE, CaptionSettings())
    with open(pid_file, "w") as f:
        f.write(str(child._child.pid))
    time.sleep(60)


def _running(pid: int) -> bool:
    try:  # a process that ended but is not yet reaped (by init, its parent gone) is a zombie: "Z"
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def test_the_resize_process_ends_when_its_job_is_killed(tmp_path):
    """A download job killed with SIGKILL (a time limit, an OOM kill): its resize process sees the pipe close
    and ends, removing its temporary tar, instead of waiting for ever on its own copy of the job's end."""
    pid_file = tmp_path / "child.pid"
    job = multiprocessing.get_context("fork").Process(
        target=_job_with_a_resize_process, args=(str(tmp_path / "p.tar"), str(pid_file))
    )
    job.start()
    deadline = time.monotonic() + 30
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline, "the job did not start its resize process"
        time.sleep(0.01)
    child = int(pid_file.read_text())
    os.kill(job.pid, signal.SIGKILL)
    job.join()
    while time.monotonic() < deadline:
        if not _running(child):
            break
        time.sleep(0.05)
    else:
        os.kill(child, signal.SIGKILL)
        raise AssertionError("the resize process outlived its killed job")
    assert find_leftovers([tmp_path]) == []


def test_curation_in_the_child_filters_captions_languages_and_boxes_each_reach_the_ledger(tmp_path, http_server):
    """A filtered record is never requested and is filed under its filter; the caption rules and bad boxes are
    rejections with their rule; a sample has its language, and its boxes and blur settings in its json."""
    s = http_server
    img = jpeg_bytes((60, 45), (40, 90, 200))  # within RESIZE's caps: passed through without boxes
    rows = [
        ("a red bicycle leaning on a wall", 0.1, "[[0.1, 0.1, 0.4, 0.5]]"),  # kept, blurred
        ("a red bicycle leaning on a wall", 0.9, "[]"),  # filter/punsafe
        ("ein rotes Fahrrad lehnt an einer Wand", 0.1, "[]"),  # caption/language
        ("bicycle", 0.1, "[]"),  # caption/too_few_words
        ("a blue car parked in the street", 0.1, "[[0.5, 0.5, 0.2, 0.9]]"),  # resize/bad_boxes (inverted)
        ("a blue car parked in the street", 0.1, None),  # resize/bad_boxes (missing)
        ("a green tree standing in a field", 0.2, "[]"),  # kept, not blurred
    ]
    manifest = [
        {"url": s.route(f"/{i}.jpg", Reply(body=img)), "caption": c, "punsafe": p, "face_bboxes": b}
        for i, (c, p, b) in enumerate(rows)
    ]
    path = tmp_path / "manifest.parquet"
    pd.DataFrame(manifest).to_parquet(path, index=False)
    source = {"name": "web", "type": "manifest", "path": str(path), "blur_boxes": "face_bboxes"}
    [pid] = plan_parts([source], 100, tmp_path / "parts", filters=[{"column": "punsafe", "op": "<", "value": 0.5}])
    captions = CaptionSettings(languages=["en"], min_words=2)
    child = ChildProcessor(str(tmp_path / "p.tar"), RESIZE, captions, blur_boxes="face_bboxes")
    status = download_part(
        str(tmp_path / "parts" / f"{pid}.parquet"), str(tmp_path / "raw.tar"), str(tmp_path / "st.parquet"),
        source, FAST, log=lambda m: None, processor=child,
    )  # fmt: skip
    assert s.count("/1.jpg") == 0 and s.count("/0.jpg") == 1
    assert child.finish(status, str(tmp_path / "s.parquet"), str(tmp_path / "r.parquet")) == (2, 5)
    ledger = pd.read_parquet(tmp_path / "r.parquet")
    assert [f"{r.stage}/{r.reason}" for r in ledger.itertuples()] == [
        "filter/punsafe", "caption/language", "caption/too_few_words", "resize/bad_boxes", "resize/bad_boxes",
    ]  # fmt: skip
    assert ledger["detail"][0] == "punsafe is 0.9; kept: punsafe < 0.5"
    assert ledger["detail"][1].startswith("de (") and ledger["detail"][1].endswith("not in languages [en]")
    samples = pd.read_parquet(tmp_path / "s.parquet")
    assert list(samples["language"]) == ["en", "en"] and (samples["language_score"] > 0.5).all()
    assert list(samples["blurred"]) == [1, 0] and list(samples["passthrough"]) == [False, True]
    tar = members(tmp_path / "p.tar")
    meta = json.loads(tar[f"{samples['key'][0]}.json"])
    assert meta["blur"] == {"boxes": [[0.1, 0.1, 0.4, 0.5]], "grow": 0.1, "sigma": 0.1}
    assert meta["language"] == "en"
    assert json.loads(tar[f"{samples['key'][1]}.json"])["blur"]["boxes"] == []
    assert tar[f"{samples['key'][1]}.jpg"] == img  # no boxes: passed through byte for byte
