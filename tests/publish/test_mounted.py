"""Publishing to a mounted path (shardsmith.publish.mounted): hard links, flushed copies, copy errors, permissions."""

import errno
import os
import shutil
from pathlib import Path

import pytest

from shardsmith.core.atomic import atomic_write_bytes
from shardsmith.publish.contents import file_table
from shardsmith.publish.dataset import publish, publish_local
from shardsmith.storage.stores import PublishError, latest_version, read_complete
from tests.publish.test_dataset import COPY, make_files, snapshot


def test_on_the_same_file_system_files_are_hard_linked_and_a_rebuild_leaves_the_version_alone(tmp_path, capsys):
    files = make_files(tmp_path / "results")
    before = {Path(f).name: Path(f).read_bytes() for f in files}
    publish(files, str(tmp_path / "fast"), "ds", "v1", threads=2)
    final = tmp_path / "fast" / "ds" / "v1"
    for f in files:
        assert (final / Path(f).name).stat().st_ino == Path(f).stat().st_ino  # a link, not a second copy
    assert "3 hard-linked, 0 copied" in capsys.readouterr().out
    # the workflow rewrites a file by writing a new one and renaming it over the old: the version keeps its bytes
    atomic_write_bytes(files[0], b"rebuilt shard zero")
    assert {name: (final / name).read_bytes() for name in before} == before
    assert read_complete(str(tmp_path / "fast"), "ds")["files"] == file_table([str(final / n) for n in before])


def test_without_links_files_are_copied_and_flushed_to_disk(tmp_path, monkeypatch, capsys):
    files = make_files(tmp_path / "results")
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(os.readlink(f"/proc/self/fd/{fd}")) or real_fsync(fd))

    def no_links(src, dst, **kw):  # e.g. dest on another file system
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", no_links)
    publish(files, str(tmp_path / "fast"), "ds", "v1")
    for f in files:
        copy = next((tmp_path / "fast" / "ds").glob(f"*/{Path(f).name}"))
        assert copy.stat().st_ino != Path(f).stat().st_ino and copy.read_bytes() == Path(f).read_bytes()
        assert any(p.endswith(f"/{Path(f).name}") for p in synced), f"{f} copied but not flushed"
    assert "0 hard-linked, 3 copied" in capsys.readouterr().out
    assert any(p.endswith(".partial") for p in synced)  # the folder's entries, before the marker
    publish(make_files(tmp_path / "v2", tag="2"), str(tmp_path / "fast"), "ds", "v2", COPY)  # links off: the same
    assert (tmp_path / "fast" / "ds" / "v2" / "ds-000000.tar").stat().st_ino != (
        tmp_path / "v2" / "ds-000000.tar"
    ).stat().st_ino


def test_a_link_error_that_a_copy_would_not_mend_fails_the_publish(tmp_path, monkeypatch):
    def failing_link(src, dst, **kw):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "link", failing_link)
    with pytest.raises(OSError, match="Input/output error"):
        publish(make_files(tmp_path / "results"), str(tmp_path / "fast"), "ds", "v1")
    assert os.listdir(tmp_path / "fast" / "ds") == []


@pytest.mark.parametrize("threads", [1, 2])
def test_a_failure_mid_copy_leaves_latest_on_the_previous_complete_version(tmp_path, monkeypatch, threads):
    dest = tmp_path / "fast"
    publish_local(make_files(tmp_path / "results"), str(dest), "ds", "v1")
    before = snapshot(dest)
    real_copy, calls = shutil.copyfile, []

    def failing_copy(src, dst, *a, **kw):
        calls.append(src)
        if len(calls) == 2:
            raise OSError("disk full")
        return real_copy(src, dst, *a, **kw)

    monkeypatch.setattr(shutil, "copyfile", failing_copy)
    with pytest.raises(OSError, match="disk full"):
        publish(make_files(tmp_path / "v2", tag="2"), str(dest), "ds", "v2", COPY, threads=threads)
    assert sorted(os.listdir(dest / "ds")) == ["latest", "v1"]  # no v2, no partial temp folder
    assert snapshot(dest) == before
    assert latest_version(str(dest), "ds") == "v1"


def test_a_corrupted_copy_is_detected_and_nothing_is_published(tmp_path, monkeypatch):
    real_copy = shutil.copyfile

    def corrupting_copy(src, dst, *a, **kw):
        real_copy(src, dst, *a, **kw)
        with open(dst, "ab") as f:
            f.write(b"garbage")

    monkeypatch.setattr(shutil, "copyfile", corrupting_copy)
    with pytest.raises(PublishError, match="does not match the source"):
        publish(make_files(tmp_path / "results"), str(tmp_path / "fast"), "ds", "v1", COPY)
    assert os.listdir(tmp_path / "fast" / "ds") == []


def test_published_marker_and_latest_are_readable_by_other_users(tmp_path):
    files = make_files(tmp_path / "results")
    os.chmod(files[0], 0o600)  # a link would share this mode: that file is copied instead
    old = os.umask(0o022)
    try:
        publish_local(files, str(tmp_path / "fast"), "ds", "v1")
    finally:
        os.umask(old)
    root = tmp_path / "fast" / "ds"
    for p in [root / "latest", root / "v1", *(root / "v1").iterdir()]:
        assert p.stat().st_mode & 0o044 == 0o044, p.name
    assert (root / "v1" / "ds-000000.tar").stat().st_ino != Path(files[0]).stat().st_ino
    assert (root / "v1" / "ds-000001.tar").stat().st_ino == Path(files[1]).stat().st_ino
