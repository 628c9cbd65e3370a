"""publish() as the entry point, on a mounted path: versions appear whole, `latest` moves last, published
versions never change, recorded hashes, retention, auto versions, the publish config."""

import datetime as dt
import hashlib
import json
import os
from pathlib import Path

import pytest
from workflow_helpers import REPO

from shardsmith.__main__ import main
from shardsmith.publish.contents import CARD, PublishConflict, content_fingerprint, file_table
from shardsmith.publish.dataset import publish, publish_local
from shardsmith.publish.settings import PublishSettings
from shardsmith.storage.stores import MARKER, PublishError, complete_versions, latest_version

REPO_ROOT = REPO
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


def test_hashes_recorded_when_written_are_not_computed_again_and_are_checked_on_the_copy(tmp_path):
    files = make_files(tmp_path / "results")
    data = Path(files[0]).read_bytes()
    recorded = {"ds-000000.tar": {"size": len(data), "sha256": "ab" * 32}}
    table = file_table(files, recorded)
    assert table["ds-000000.tar"]["sha256"] == "ab" * 32  # taken as recorded: the file was not hashed
    assert table["ds-000001.tar"]["sha256"] == hashlib.sha256(b"shard one").hexdigest()  # none recorded: hashed
    with pytest.raises(PublishError, match="ds-000001.tar: changed since it was written and hashed .* --forcerun"):
        file_table(files, {**recorded, "ds-000001.tar": {"size": 1, "sha256": "cd" * 32}})  # another size
    Path(files[1]).rename(tmp_path / "away")  # deleted after write_shard wrote it: named, with what to run
    with pytest.raises(PublishError, match=r"ds-000001.tar is missing \(1 files in all\).* --forcerun write_shard"):
        file_table(files, recorded)
    (tmp_path / "away").rename(files[1])
    # the recorded hash is wrong, as for a shard changed after write_shard hashed it: the copy is refused
    with pytest.raises(PublishError, match="ds-000000.tar: changed since it was written and hashed"):
        publish(files, str(tmp_path / "fast"), "ds", "v1", known=recorded)
    assert os.listdir(tmp_path / "fast" / "ds") == [] and latest_version(str(tmp_path / "fast"), "ds") is None
    right = {"ds-000000.tar": {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}}
    assert publish(files, str(tmp_path / "fast"), "ds", "v1", known=right)["files"] == file_table(files)


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


@pytest.mark.parametrize("version", ["latest", "a/b", "../escaped", ".hidden", ""])
def test_a_version_that_is_no_plain_name_or_is_latest_is_refused_before_anything_is_written(tmp_path, version):
    """A version folder named `latest` would stand where the pointer goes, and a path would land elsewhere."""
    dest = tmp_path / "fast"
    publish(make_files(tmp_path / "a"), str(dest), "ds", "v1")
    with pytest.raises(PublishError, match="cannot be published"):
        publish(make_files(tmp_path / "b", tag="2"), str(dest), "ds", version)
    assert sorted(os.listdir(dest / "ds")) == ["latest", "v1"] and latest_version(str(dest), "ds") == "v1"
    assert sorted(os.listdir(tmp_path)) == ["a", "b", "fast"]


def test_the_publish_command_names_a_file_given_that_does_not_exist(tmp_path, capsys):
    """The command's files are the user's: the message names the path, not a workflow rule to run again."""
    files = make_files(tmp_path / "a")
    gone = str(tmp_path / "a" / "ds-000009.tar")
    assert main(["publish", *files, gone, "--dest", str(tmp_path / "fast"), "--dataset", "ds", "--version", "v1"]) == 1
    assert capsys.readouterr().err == f"shardsmith: publish: {gone} does not exist (1 of the files given)\n"
    assert not (tmp_path / "fast").exists()


def test_versions_of_a_destination_without_any_says_so(tmp_path, capsys):
    from shardsmith.__main__ import main

    assert main(["versions", "--dest", str(tmp_path / "typo"), "--dataset", "ds"]) == 0
    out, err = capsys.readouterr()
    assert out == "" and err.strip() == f"shardsmith: no complete version of ds at {tmp_path / 'typo'}"
