"""Publishing: complete versions appear atomically, `latest` moves last, published versions never change."""

import hashlib
import json
import os
import shutil

import pytest

from shardsmith.publish import MARKER, PublishConflict, publish_local


def make_files(folder, tag: str = "") -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    contents = {"ds-000000.tar": b"shard zero" + tag.encode(), "ds-000001.tar": b"shard one", "sizes.json": b"{}"}
    for name, data in contents.items():
        (folder / name).write_bytes(data)
    return [str(folder / n) for n in contents]


def snapshot(root) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_publish_copies_files_with_a_complete_marker_and_writes_latest(tmp_path):
    files = make_files(tmp_path / "results")
    marker = publish_local(files, str(tmp_path / "fast"), "ds", "v1")
    final = tmp_path / "fast" / "ds" / "v1"
    assert sorted(os.listdir(final)) == sorted([MARKER, "ds-000000.tar", "ds-000001.tar", "sizes.json"])
    for f in files:
        data = open(f, "rb").read()
        name = os.path.basename(f)
        assert (final / name).read_bytes() == data
        assert marker["files"][name] == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert (
        json.loads((final / MARKER).read_text())
        == marker
        == {"dataset": "ds", "version": "v1", "files": marker["files"]}
    )
    assert (tmp_path / "fast" / "ds" / "latest").read_text() == "v1\n"
    assert sorted(os.listdir(tmp_path / "fast" / "ds")) == ["latest", "v1"]  # no temporary folder left


def test_publishing_the_same_content_again_is_a_no_op_success(tmp_path):
    files = make_files(tmp_path / "results")
    first = publish_local(files, str(tmp_path / "fast"), "ds", "v1")
    before = snapshot(tmp_path / "fast")
    assert publish_local(files, str(tmp_path / "fast"), "ds", "v1") == first
    assert snapshot(tmp_path / "fast") == before


def test_different_content_under_a_published_version_is_refused(tmp_path):
    dest = tmp_path / "fast"
    publish_local(make_files(tmp_path / "results"), str(dest), "ds", "v1")
    before = snapshot(dest)
    with pytest.raises(PublishConflict, match="already exists with different content"):
        publish_local(make_files(tmp_path / "changed", tag="!"), str(dest), "ds", "v1")
    assert snapshot(dest) == before


def test_a_failure_mid_copy_leaves_latest_on_the_previous_complete_version(tmp_path, monkeypatch):
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
        publish_local(make_files(tmp_path / "v2", tag="2"), str(dest), "ds", "v2")
    assert sorted(os.listdir(dest / "ds")) == ["latest", "v1"]  # no v2, no partial temp folder
    assert snapshot(dest) == before


def test_a_corrupted_copy_is_detected_and_nothing_is_published(tmp_path, monkeypatch):
    real_copy = shutil.copyfile

    def corrupting_copy(src, dst, *a, **kw):
        real_copy(src, dst, *a, **kw)
        with open(dst, "ab") as f:
            f.write(b"garbage")

    monkeypatch.setattr(shutil, "copyfile", corrupting_copy)
    with pytest.raises(OSError, match="does not match the source"):
        publish_local(make_files(tmp_path / "results"), str(tmp_path / "fast"), "ds", "v1")
    assert os.listdir(tmp_path / "fast" / "ds") == []


def test_published_marker_and_latest_are_readable_by_other_users(tmp_path):
    old = os.umask(0o022)
    try:
        publish_local(make_files(tmp_path / "results"), str(tmp_path / "fast"), "ds", "v1")
    finally:
        os.umask(old)
    root = tmp_path / "fast" / "ds"
    for p in [root / "latest", root / "v1", *(root / "v1").iterdir()]:
        assert p.stat().st_mode & 0o044 == 0o044, p.name
