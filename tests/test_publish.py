"""Publishing to a mounted path, and the pure logic shared with S3: versions appear whole, `latest` moves
last, published versions never change, retention, auto versions, ETags, build metadata."""

import datetime as dt
import errno
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from shardsmith.build import BUILD_INFO, build_info
from shardsmith.contents import CARD, PublishConflict, auto_version, content_fingerprint, file_table
from shardsmith.publish import PublishSettings, publish, publish_local
from shardsmith.publish_s3 import _batches, expected_etag, human_bytes
from shardsmith.stores import MARKER, PublishError, complete_versions, latest_version, read_complete
from shardsmith.tario import atomic_write_bytes

REPO_ROOT = Path(__file__).resolve().parents[1]
COPY = PublishSettings(hardlink=False)
T0 = dt.datetime(2026, 11, 22, 3, 17, tzinfo=dt.UTC)


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
        data = Path(f).read_bytes()
        name = os.path.basename(f)
        assert (final / name).read_bytes() == data
        assert marker["files"][name] == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert json.loads((final / MARKER).read_text()) == marker
    assert marker["dataset"] == "ds" and marker["version"] == "v1" and marker["previous"] is None
    assert (tmp_path / "fast" / "ds" / "latest").read_text() == "v1\n"
    assert sorted(os.listdir(tmp_path / "fast" / "ds")) == ["latest", "v1"]  # no temporary folder left


def test_publishing_the_same_content_again_is_a_no_op_success(tmp_path):
    files = make_files(tmp_path / "results")
    first = publish_local(files, str(tmp_path / "fast"), "ds", "v1")
    before = snapshot(tmp_path / "fast")
    receipt = publish(files, str(tmp_path / "fast"), "ds", "v1")
    assert receipt["unchanged"] is True and receipt["files"] == first["files"]
    assert receipt["published_at"] == first["published_at"]  # the original marker, not a new one
    assert snapshot(tmp_path / "fast") == before


def test_different_content_under_a_published_version_is_refused(tmp_path):
    dest = tmp_path / "fast"
    publish_local(make_files(tmp_path / "results"), str(dest), "ds", "v1")
    before = snapshot(dest)
    with pytest.raises(PublishConflict, match="already published with different content; choose a new version"):
        publish_local(make_files(tmp_path / "changed", tag="!"), str(dest), "ds", "v1")
    assert snapshot(dest) == before


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


def test_hashes_recorded_when_written_are_not_computed_again_and_are_checked_on_the_copy(tmp_path):
    files = make_files(tmp_path / "results")
    data = Path(files[0]).read_bytes()
    recorded = {"ds-000000.tar": {"size": len(data), "sha256": "ab" * 32}}
    table = file_table(files, recorded)
    assert table["ds-000000.tar"]["sha256"] == "ab" * 32  # taken as recorded: the file was not hashed
    assert table["ds-000001.tar"]["sha256"] == hashlib.sha256(b"shard one").hexdigest()  # none recorded: hashed
    with pytest.raises(PublishError, match="ds-000001.tar: changed since it was written and hashed .* --forcerun"):
        file_table(files, {**recorded, "ds-000001.tar": {"size": 1, "sha256": "cd" * 32}})  # another size
    # the recorded hash is wrong, as for a shard changed after write_shard hashed it: the copy is refused
    with pytest.raises(PublishError, match="ds-000000.tar: changed since it was written and hashed"):
        publish(files, str(tmp_path / "fast"), "ds", "v1", known=recorded)
    assert os.listdir(tmp_path / "fast" / "ds") == [] and latest_version(str(tmp_path / "fast"), "ds") is None
    right = {"ds-000000.tar": {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}}
    assert publish(files, str(tmp_path / "fast"), "ds", "v1", known=right)["files"] == file_table(files)


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


def test_readers_see_only_complete_versions(tmp_path):
    dest = str(tmp_path / "fast")
    publish(make_files(tmp_path / "a"), dest, "ds", "v1", now=T0)
    (tmp_path / "fast" / "ds" / ".v2.x.partial").mkdir()  # a publish in progress
    (tmp_path / "fast" / "ds" / "v3").mkdir()  # a folder without a marker: not a version
    assert list(complete_versions(dest, "ds")) == ["v1"]
    assert read_complete(dest, "ds")["version"] == "v1"
    with pytest.raises(PublishError, match="not a complete published version"):
        read_complete(dest, "ds", "v3")
    (tmp_path / "fast" / "ds" / "latest").write_text("v3\n")  # a pointer at a partial version is refused
    with pytest.raises(PublishError, match="no _COMPLETE.json"):
        latest_version(dest, "ds")


def test_auto_version_is_date_and_content_and_unchanged_data_publishes_nothing(tmp_path):
    dest = str(tmp_path / "fast")
    files = make_files(tmp_path / "a")
    first = publish(files, dest, "ds", "auto", now=T0)
    assert first["version"] == f"2026-11-22-{content_fingerprint(file_table(files))[:8]}"
    again = publish(files, dest, "ds", "auto", now=T0 + dt.timedelta(days=1))  # next day, same data
    assert again["unchanged"] is True and again["version"] == first["version"]
    assert list(complete_versions(dest, "ds")) == [first["version"]]
    grown = publish(make_files(tmp_path / "b", tag="new"), dest, "ds", "auto", now=T0 + dt.timedelta(days=1))
    assert grown["version"].startswith("2026-11-23-") and grown["previous"] == first["version"]
    assert latest_version(dest, "ds") == grown["version"]


def test_auto_after_a_named_version_with_the_same_data_publishes_nothing(tmp_path):
    dest = str(tmp_path / "fast")
    named = make_files(tmp_path / "a")
    Path(tmp_path / "a" / CARD).write_text("# ds v1\n")
    publish([*named, str(tmp_path / "a" / CARD)], dest, "ds", "v1", now=T0)
    rebuilt = make_files(tmp_path / "b")  # the same shards and index; only the card's title differs
    Path(tmp_path / "b" / CARD).write_text("# ds\n\nThe version is named when published.\n")
    again = publish([*rebuilt, str(tmp_path / "b" / CARD)], dest, "ds", "auto", now=T0 + dt.timedelta(days=1))
    assert again["unchanged"] is True and again["version"] == "v1"
    assert list(complete_versions(dest, "ds")) == ["v1"] and latest_version(dest, "ds") == "v1"


def test_build_json_alone_does_not_make_new_data():
    table = {"a.tar": {"size": 1, "sha256": "aa"}, BUILD_INFO: {"size": 5, "sha256": "bb"}}
    other_build = {**table, BUILD_INFO: {"size": 6, "sha256": "cc"}}
    assert content_fingerprint(table) == content_fingerprint(other_build)
    assert content_fingerprint(table) != content_fingerprint({**table, "a.tar": {"size": 1, "sha256": "ab"}})
    assert auto_version(table, dt.datetime(2026, 1, 2, 23, 30, tzinfo=dt.timezone(dt.timedelta(hours=-5)))).startswith(
        "2026-01-03-"
    )


def test_retention_keeps_the_newest_versions_and_never_the_one_latest_names(tmp_path):
    dest = str(tmp_path / "fast")
    for i in range(1, 4):
        publish(make_files(tmp_path / f"v{i}", tag=str(i)), dest, "ds", f"v{i}", now=T0 + dt.timedelta(hours=i))
    assert list(complete_versions(dest, "ds")) == ["v1", "v2", "v3"]
    # Re-publishing v1 points latest back at it; keeping 1 version then keeps v3 (newest) and v1 (latest).
    receipt = publish(make_files(tmp_path / "v1-again", tag="1"), dest, "ds", "v1", PublishSettings(keep_versions=1))
    assert receipt["deleted"] == ["v2"] and receipt["unchanged"] is True
    assert list(complete_versions(dest, "ds")) == ["v1", "v3"] and latest_version(dest, "ds") == "v1"
    assert sorted(os.listdir(tmp_path / "fast" / "ds")) == ["latest", "v1", "v3"]  # no leftovers


def test_two_files_with_one_name_or_a_reserved_name_are_refused(tmp_path):
    a, b = make_files(tmp_path / "a"), make_files(tmp_path / "b")
    with pytest.raises(ValueError, match="share a name"):
        file_table([a[0], b[0]])
    (tmp_path / "latest").write_text("x")
    with pytest.raises(ValueError, match="written by publishing"):
        file_table([str(tmp_path / "latest")])


def make_nested(folder) -> list[str]:
    """A dataset folder with a sub-folder to publish as one (Energon's .nv-meta/)."""
    files = make_files(folder)
    (folder / ".nv-meta").mkdir()
    for name, data in {"split.yaml": b"split_parts: {}\n", "index.sqlite": b"SQLite format 3\0"}.items():
        (folder / ".nv-meta" / name).write_bytes(data)
        files.append(str(folder / ".nv-meta" / name))
    return files


@pytest.mark.parametrize("hardlink", [True, False])
def test_files_in_a_sub_folder_are_published_in_that_sub_folder_of_the_version(tmp_path, hardlink):
    files = make_nested(tmp_path / "out")
    settings = PublishSettings(hardlink=hardlink)
    marker = publish(files, str(tmp_path / "fast"), "ds", "v1", settings, names_from=tmp_path / "out")
    final = tmp_path / "fast" / "ds" / "v1"
    names = {".nv-meta/index.sqlite", ".nv-meta/split.yaml", "ds-000000.tar", "ds-000001.tar", "sizes.json"}
    assert set(marker["files"]) == names
    assert set(snapshot(final)) == names | {MARKER}
    for name in names:
        assert (final / name).read_bytes() == (tmp_path / "out" / name).read_bytes()
        assert marker["files"][name]["sha256"] == hashlib.sha256((final / name).read_bytes()).hexdigest()
    again = publish(files, str(tmp_path / "fast"), "ds", "v1", settings, names_from=tmp_path / "out")
    assert again["unchanged"] is True  # the same names and content: a no-op
    # without names_from two files named split.yaml in different folders would collide; with it they do not
    other = tmp_path / "out" / "split.yaml"
    other.write_text("x")
    assert ".nv-meta/split.yaml" in file_table([*files, str(other)], names_from=tmp_path / "out")
    with pytest.raises(ValueError, match="share a name"):
        file_table([*files, str(other)])


def test_a_file_outside_names_from_keeps_its_basename_and_unsafe_names_are_refused(tmp_path):
    files = make_nested(tmp_path / "out")
    elsewhere = tmp_path / "work" / "build.json"
    elsewhere.parent.mkdir()
    elsewhere.write_text("{}")
    table = file_table([*files, str(elsewhere)], names_from=tmp_path / "out")
    assert "build.json" in table and ".nv-meta/split.yaml" in table
    (tmp_path / "out" / "sub").mkdir()
    (tmp_path / "out" / "sub" / MARKER).write_text("{}")
    with pytest.raises(ValueError, match="written by publishing"):  # not even in a sub-folder
        file_table([str(tmp_path / "out" / "sub" / MARKER)], names_from=tmp_path / "out")


def test_human_sizes_read_like_the_aws_cli():
    assert human_bytes(123) == 123 and human_bytes("5MB") == 5 * 1024**2 == human_bytes("5MiB")
    assert human_bytes("1GB") == 1024**3 and human_bytes("4096") == 4096


def test_expected_etag_is_md5_or_multipart_md5(tmp_path):
    data = os.urandom(12 * 1024**2 + 5)
    path = tmp_path / "x.bin"
    path.write_bytes(data)
    assert expected_etag(path, threshold=len(data) + 1) == hashlib.md5(data).hexdigest()
    chunk = 5 * 1024**2
    parts = [data[i : i + chunk] for i in range(0, len(data), chunk)]
    want = hashlib.md5(b"".join(hashlib.md5(p).digest() for p in parts)).hexdigest() + "-3"
    assert expected_etag(path, threshold=chunk, chunksize=chunk) == want
    # parts below S3's 5 MiB minimum are raised to it, as the CLI does
    assert expected_etag(path, threshold=1, chunksize=1024) == want


def test_read_back_batches_bound_scratch_space():
    table = {f"s{i}": {"size": 10, "sha256": ""} for i in range(7)}
    assert [len(b) for b in _batches(list(table), table, limit=25)] == [2, 2, 2, 1]
    assert [len(b) for b in _batches(list(table), table, limit=10**9, most=3)] == [3, 3, 1]
    assert list(_batches(["big"], {"big": {"size": 100}}, limit=1)) == [["big"]]


def test_build_info_fingerprints_the_content_config_only(tmp_path):
    from workflow_helpers import REPO

    config = {
        "dataset": "ds",
        "version": "v1",
        "paths": {"raw": "/a", "work": "/b", "output": "/c"},
        "publish": {"dest": "/d"},
        "s3": {"endpoint_url": None},
        "resize": {"max_side": 512},
    }
    info = build_info(config, "9.27.1", REPO)
    moved = {
        **config,
        "version": "v2",
        "paths": {"raw": "/x", "work": "/y", "output": "/z"},
        "publish": {"dest": "s3://b/p"},
    }
    assert build_info(moved, "9.27.1", REPO) == info  # where files live is not what is built
    resized = {**config, "resize": {"max_side": 256}}
    assert build_info(resized, "9.27.1", REPO)["config_fingerprint"] != info["config_fingerprint"]
    assert info["config_fingerprint"].startswith("sha256:") and "paths" not in info["config"]
    assert {"python", "snakemake", "pandas", "pyarrow", "webdataset"} <= set(info["packages"])
    assert info["packages"]["snakemake"] == "9.27.1"
    assert "shardsmith/publish.py" in info["code"]


def test_the_schema_takes_the_publish_keys_and_refuses_bad_values():
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    schema = str(REPO_ROOT / "config" / "config.schema.yaml")

    def config(**publish):
        return {
            "dataset": "ds", "version": "auto", "paths": {"raw": "r", "work": "w", "output": "o"},
            "sources": [{"name": "m", "type": "manifest", "path": "m.tsv"}],
            "publish": {"dest": "s3://bucket/prefix", **publish},
        }  # fmt: skip

    good = config(
        keep_versions=3,
        verify="etag",
        multipart_chunksize="64MB",
        multipart_threshold=8388608,
        max_concurrent_requests=16,
    )
    validate(good, schema=schema)
    assert PublishSettings.from_config(good["publish"]) == PublishSettings(3, "etag", 8388608, "64MB", 16)
    assert PublishSettings.from_config(config(hardlink=False)["publish"]) == COPY
    for bad in (
        {"verify": "md5"},
        {"keep_versions": 0},
        {"multipart_chunksize": "64 megabytes"},
        {"dedupe": "yes"},
        {"hardlink": "no"},
    ):
        with pytest.raises(WorkflowError):
            validate(config(**bad), schema=schema)
