"""The raw cache's keep (shardsmith.download.rawcache): a damaged keep is never reused; a running part's commits
hold whole records only. Real HTTP server, 127.0.0.1."""

import os
import shutil
from pathlib import Path

import pandas as pd
from generated import jpeg_bytes
from httpserver import Reply

from shardsmith.download import commits, rawcache
from shardsmith.download.rawcache import Keep, progress, write_raw
from shardsmith.formats.tario import ShardWriter
from tests.download.test_part import manifest_source, reasons, snakemake_deletes_outputs, write_manifest
from tests.download.test_part import run_remote as run


def test_a_damaged_keep_is_ignored_and_the_part_fetched_again(tmp_path, http_server):
    url = http_server.route("/a.jpg", Reply(body=jpeg_bytes()))
    write_manifest(tmp_path / "m.parquet", [{"url": url, "caption": "x"}])
    run(tmp_path, manifest_source(tmp_path / "m.parquet"))
    keep = Keep(tmp_path / "raw" / "web-000000.tar")
    assert keep.load() is not None
    size = keep.tar.stat().st_size
    keep.tar.unlink()
    keep.tar.write_bytes(b"\0" * 1024)  # e.g. a run killed between writing the tar and the keep's record of it
    snakemake_deletes_outputs(tmp_path)
    [(status, raw)] = run(tmp_path, manifest_source(tmp_path / "m.parquet"))
    assert reasons(status) == ["ok"] and http_server.count("/a.jpg") == 2
    keep.tar.unlink()
    keep.tar.write_bytes(b"\xff" * size)  # same size, garbage inside
    snakemake_deletes_outputs(tmp_path)
    [(status, raw)] = run(tmp_path, manifest_source(tmp_path / "m.parquet"))
    assert reasons(status) == ["ok"] and http_server.count("/a.jpg") == 3


def _row(rid: int) -> dict:
    return {"rid": rid, "source": "web", "source_id": f"s{rid}", "url": f"u{rid}", "key": f"k{rid}", "status": "ok",
            "reason": "", "detail": "", "bytes": 3, "http_status": 200, "attempts": 1}  # fmt: skip


def _download(tmp_path, monkeypatch, every: int, rids: int, torn: bytes = b"") -> tuple[Path, commits.Commits]:
    """A part whose records 0..rids-1 are written and added, committed every `every`; `torn` written after."""
    monkeypatch.setattr(rawcache, "COMMIT_RECORDS", every)
    out = tmp_path / "raw" / "p-000000.tar"
    out.parent.mkdir()
    with open(tmp_path / "raw" / ".p-000000.tar.tmp", "wb") as f:
        tar = ShardWriter(f)
        done = progress(Keep(out), f, tar)
        for rid in range(rids):
            write_raw(tar, rid, b"img", b"{}")
            done.add(_row(rid))
        f.write(torn)
    return out, done


def test_a_commit_holds_whole_records_and_a_torn_write_or_an_unfinished_commit_is_never_read(tmp_path, monkeypatch):
    # the second row commits records 0 and 1; the third is cut short by a kill, past the committed size
    out, done = _download(tmp_path, monkeypatch, 2, 3, torn=b"r0000003.img\0torn")
    keep = Keep(out)
    assert list(keep.load()["rid"]) == [0, 1] and sorted(keep.members()) == [0, 1]
    assert keep.read(keep.members()[1]["img"]) == b"img"
    # a kill during the next commit: its piece written, not yet named in the JSON
    pieces = sorted(done.folder.glob("*.parquet"))
    (done.folder / "000001.parquet").write_bytes(pieces[0].read_bytes())
    assert list(Keep(out).load()["rid"]) == [0, 1]


def test_a_finished_run_removes_the_commits_and_is_preferred_to_an_older_one(tmp_path, monkeypatch):
    out, done = _download(tmp_path, monkeypatch, 1, 1)
    keep = Keep(out)
    assert list(keep.load()["rid"]) == [0]
    committed = commits.meta_path(keep.dir, keep.part)
    stale = committed.read_bytes()
    shutil.copytree(done.folder, tmp_path / "commit")
    status = pd.DataFrame([_row(0), {**_row(1), "status": "error", "reason": "not_found"}])
    os.link(tmp_path / "raw" / ".p-000000.tar.tmp", out)
    status.to_parquet(tmp_path / "raw" / "p-000000.status.parquet")
    keep.save(str(out), str(tmp_path / "raw" / "p-000000.status.parquet"), status)
    assert not committed.exists() and not list(keep.dir.glob("*.progress-*"))
    shutil.copytree(tmp_path / "commit", done.folder)  # a run stopped between saving and removing its commit
    committed.write_bytes(stale)
    assert list(Keep(out).load()["rid"]) == [0]  # written after the save: taken
    os.utime(committed, ns=(keep.meta.stat().st_mtime_ns - 10**9,) * 2)
    assert list(Keep(out).load()["rid"]) == [0, 1]  # older than the save: the finished run's
