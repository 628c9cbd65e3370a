"""A job's progress commits (shardsmith.download.commits): a commit is whole or absent, a torn write past it is
never read, a job's first commit supersedes a stopped job's, and without hard links the job runs on uncommitted."""

import json
import os

import pandas as pd

from shardsmith.download import commits
from shardsmith.formats.tario import ShardWriter


def table(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=["n"])


def job(tmp_path, name: str = "p", every: int = 2, run: int = 0):
    f = open(tmp_path / f".{name}.{run}.tmp", "wb")  # noqa: SIM115 - the test closes it; a temporary name a run
    tar = ShardWriter(f)
    return f, tar, commits.Commits(tmp_path / ".keep", name, f, tar, table, every, 1e9, meta={"settings": 1})


def test_rows_are_committed_with_the_bytes_before_them_and_nothing_past_the_committed_size(tmp_path):
    f, tar, done = job(tmp_path)
    for n in range(3):
        tar.write(f"k{n}", {"img": b"x" * 700})
        done.add({"n": n})  # the second add commits rows 0 and 1
    size = tar.offset
    f.write(b"torn")
    f.flush()
    got = commits.load(tmp_path / ".keep", "p")
    assert list(got.rows["n"]) == [0, 1] and got.meta["settings"] == 1
    written = (tmp_path / ".p.0.tmp").read_bytes()
    assert got.size == size - 1536 and got.data.read_bytes()[: got.size] == written[: got.size]
    (done.folder / "000001.parquet").write_bytes(b"a piece whose commit was cut short")  # not named by the JSON
    assert list(commits.load(tmp_path / ".keep", "p").rows["n"]) == [0, 1]
    f.close()


def test_a_jobs_first_commit_supersedes_a_stopped_jobs_and_drop_removes_all(tmp_path):
    f, tar, first = job(tmp_path)
    tar.write("a", {"img": b"1"})
    first.add({"n": 0})
    first.commit()
    f.close()
    g, tar2, second = job(tmp_path, every=1, run=1)
    assert commits.load(tmp_path / ".keep", "p").data.parent == first.folder  # until the second job commits
    tar2.write("b", {"img": b"2"})
    second.add({"n": 5})
    assert not first.folder.exists() and list(commits.load(tmp_path / ".keep", "p").rows["n"]) == [5]
    commits.drop(tmp_path / ".keep", "p")
    assert list((tmp_path / ".keep").iterdir()) == []
    g.close()


def test_an_older_commit_than_a_finished_record_is_not_taken(tmp_path):
    f, tar, done = job(tmp_path, every=1)
    tar.write("a", {"img": b"1"})
    done.add({"n": 0})
    f.close()
    record = tmp_path / "finished.json"
    record.write_text(json.dumps({}))
    meta = commits.meta_path(tmp_path / ".keep", "p")
    os.utime(meta, ns=(record.stat().st_mtime_ns - 10**9,) * 2)
    assert commits.load(tmp_path / ".keep", "p", older=record) is None
    assert commits.load(tmp_path / ".keep", "p") is not None


def test_without_hard_links_the_job_runs_on_without_commits(tmp_path, monkeypatch):
    said = []
    f, tar, done = job(tmp_path, every=1)
    done.log = said.append

    def no_links(*args):
        raise OSError("links not supported")

    monkeypatch.setattr(commits.os, "link", no_links)
    tar.write("a", {"img": b"1"})
    done.add({"n": 0})
    assert not done.enabled and "progress is not kept" in said[0]
    assert commits.load(tmp_path / ".keep", "p") is None
    assert not (tmp_path / ".keep").exists() or list((tmp_path / ".keep").iterdir()) == []
    f.close()
