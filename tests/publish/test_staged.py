"""Publishing spread over jobs (shardsmith.publish.staged), on a mounted path and on S3 (moto_server on
loopback through the real aws CLI): the same version as one publish, kills during an upload and before the
commit, nothing verified sent again, conflicts refused, leftovers of another attempt removed."""

import datetime as dt
import os
import shutil
from pathlib import Path

import pytest

from shardsmith.publish.contents import PublishConflict
from shardsmith.publish.dataset import publish
from shardsmith.publish.settings import PublishSettings
from shardsmith.publish.staged import commit_version, plan_version, split_batches, staging_dir, upload_batch
from shardsmith.storage.stores import LocalStore, PublishError, complete_versions, latest_version
from tests.publish.test_dataset import snapshot
from tests.publish.test_s3 import objects

T0 = dt.datetime(2026, 11, 26, 3, 17, tzinfo=dt.UTC)
COPY = PublishSettings(hardlink=False)


def make_files(folder: Path, tag: str = "", shards: int = 6) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(shards):
        (folder / f"ds-{i:06d}.tar").write_bytes(f"shard {i} {tag}".encode() * (200 + 50 * i))
        (folder / f"ds-{i:06d}.idx").write_bytes(f"index {i}\n".encode())
    (folder / "sizes.json").write_bytes(b'{"ds-000000.tar": 1}\n')
    (folder / ".nv-meta").mkdir(exist_ok=True)
    (folder / ".nv-meta" / "split.yaml").write_bytes(b"split_parts: {}\n")
    return sorted(str(p) for p in folder.rglob("*") if p.is_file())


def run_batches(files, dest, version, batches, settings=PublishSettings(), s3=None, skip=()) -> tuple[dict, list]:
    """plan_version, upload_batch for each batch (but those in `skip`), as the workflow's jobs do."""
    folder = os.path.commonpath(files)
    plan, runs = plan_version(files, dest, "ds", version, batches, settings, s3, names_from=folder, now=T0)
    receipts, after = [], None
    for i, batch in enumerate(runs):
        if i not in skip:
            receipts.append(upload_batch(plan, batch, after, settings, s3))
        after = max(batch, default=after)
    return plan, receipts


def publish_in_batches(files, dest, version, batches, settings=PublishSettings(), s3=None) -> dict:
    plan, receipts = run_batches(files, dest, version, batches, settings, s3)
    return commit_version(plan, receipts, settings, s3, now=T0)


def test_batches_are_runs_of_names_of_about_equal_bytes():
    table = {f"f{i:02d}": {"size": 10 << 20} for i in range(12)} | {"z-small": {"size": 1}}
    batches = split_batches(table, 4)
    assert [n for b in batches for n in b] == sorted(table)  # every name once, in order
    assert [len(b) for b in batches] == [3, 3, 3, 4]
    assert split_batches(table, 1) == [sorted(table)]
    assert sum(map(len, split_batches(table, 40))) == 13  # more batches than files: some are empty


@pytest.mark.parametrize("hardlink", [True, False])
def test_several_upload_jobs_publish_the_same_bytes_as_one(tmp_path, hardlink):
    settings = PublishSettings(hardlink=hardlink)
    files = make_files(tmp_path / "out")
    one = publish(files, str(tmp_path / "one"), "ds", "v1", settings, now=T0, names_from=tmp_path / "out")
    several = publish_in_batches(files, str(tmp_path / "several"), "v1", 4, settings)
    assert several == {**one, "dest": str(tmp_path / "several")}
    assert snapshot(tmp_path / "several") == snapshot(tmp_path / "one")  # marker and latest included
    assert sorted(os.listdir(tmp_path / "several" / "ds")) == ["latest", "v1"]  # the staging folder renamed


def test_a_kill_during_an_upload_leaves_latest_alone_and_the_rerun_sends_only_what_is_missing(tmp_path, monkeypatch):
    dest = str(tmp_path / "fast")
    publish(make_files(tmp_path / "v1", tag="one"), dest, "ds", "v1", COPY, now=T0)
    files = make_files(tmp_path / "out")
    plan, runs = plan_version(files, dest, "ds", "v2", 3, COPY, names_from=tmp_path / "out", now=T0)
    done = upload_batch(plan, runs[0], None, COPY)  # the first job ends; the second dies after two copies
    real_copy, copied = shutil.copyfile, []

    def dying_copy(src, dst, *a, **kw):
        if len(copied) == 2:
            raise KeyboardInterrupt  # the job is killed mid-copy
        copied.append(os.path.basename(src))
        return real_copy(src, dst, *a, **kw)

    monkeypatch.setattr(shutil, "copyfile", dying_copy)
    with pytest.raises(KeyboardInterrupt):
        upload_batch(plan, runs[1], max(runs[0]), COPY)
    assert latest_version(dest, "ds") == "v1" and list(complete_versions(dest, "ds")) == ["v1"]
    # the rerun of the killed job: what it placed is read back and kept, the rest copied; the first job's
    # files are not touched again (its job is not rerun)
    first_copies = list(copied)
    copied.clear()
    monkeypatch.setattr(
        shutil, "copyfile", lambda src, dst, *a, **kw: copied.append(os.path.basename(src)) or real_copy(src, dst)
    )
    receipts = [done, upload_batch(plan, runs[1], max(runs[0]), COPY), upload_batch(plan, runs[2], max(runs[1]), COPY)]
    assert not set(copied) & set(first_copies) and set(copied) | set(first_copies) == {
        os.path.basename(n) for n in runs[1] | runs[2]
    }
    receipt = commit_version(plan, receipts, COPY, now=T0)
    assert receipt["version"] == "v2" and latest_version(dest, "ds") == "v2"
    one = publish(files, str(tmp_path / "one"), "ds", "v2", COPY, now=T0, names_from=tmp_path / "out")
    assert one["files"] == receipt["files"]


def test_a_kill_between_the_last_upload_and_the_commit_is_finished_by_the_commit_alone(tmp_path, monkeypatch):
    dest = str(tmp_path / "fast")
    publish(make_files(tmp_path / "v1", tag="one"), dest, "ds", "v1", COPY, now=T0)
    plan, receipts = run_batches(make_files(tmp_path / "out"), dest, "v2", 3, COPY)
    # every batch uploaded, no commit yet: readers still see v1 only
    assert latest_version(dest, "ds") == "v1" and list(complete_versions(dest, "ds")) == ["v1"]
    assert staging_dir(LocalStore(dest, "ds"), "v2").is_dir()
    monkeypatch.setattr(shutil, "copyfile", lambda *a, **kw: pytest.fail("the commit copied a file"))
    monkeypatch.setattr(os, "link", lambda *a, **kw: pytest.fail("the commit linked a file"))
    receipt = commit_version(plan, receipts, COPY, now=T0)
    assert receipt["unchanged"] is False and receipt["previous"] == "v1"
    assert latest_version(dest, "ds") == "v2" and list(complete_versions(dest, "ds")) == ["v1", "v2"]


def test_a_commit_without_every_batch_or_with_a_file_gone_is_refused(tmp_path):
    dest = str(tmp_path / "fast")
    plan, receipts = run_batches(make_files(tmp_path / "out"), dest, "v1", 3, skip={1})
    with pytest.raises(PublishError, match="receipts do not cover"):
        commit_version(plan, receipts)
    plan, receipts = run_batches(make_files(tmp_path / "out"), dest, "v1", 3)
    (staging_dir(LocalStore(dest, "ds"), "v1") / "ds-000003.tar").unlink()  # removed from the staging folder
    with pytest.raises(PublishError, match="lacks 1 of the version's files"):
        commit_version(plan, receipts)
    assert latest_version(dest, "ds") is None


def test_other_content_under_a_published_version_is_refused_before_any_upload(tmp_path):
    dest = str(tmp_path / "fast")
    publish_in_batches(make_files(tmp_path / "out"), dest, "v1", 2)
    before = snapshot(tmp_path / "fast")
    with pytest.raises(PublishConflict, match="already published with different content"):
        plan_version(make_files(tmp_path / "other", tag="x"), dest, "ds", "v1", 2)
    assert snapshot(tmp_path / "fast") == before
    # the same content again: unchanged, nothing uploaded, the original marker
    plan, receipts = run_batches(make_files(tmp_path / "out"), dest, "v1", 2)
    assert plan["unchanged"] and commit_version(plan, receipts)["unchanged"] is True
    assert snapshot(tmp_path / "fast") == before


def test_a_version_named_latest_is_refused_when_planned(tmp_path):
    """Its folder would stand where the pointer goes: refused before any job uploads."""
    dest = str(tmp_path / "fast")
    publish_in_batches(make_files(tmp_path / "out"), dest, "v1", 2)
    before = snapshot(tmp_path / "fast")
    with pytest.raises(PublishError, match="cannot be published"):
        plan_version(make_files(tmp_path / "other", tag="x"), dest, "ds", "latest", 2)
    assert snapshot(tmp_path / "fast") == before and latest_version(dest, "ds") == "v1"


def test_files_an_attempt_with_other_content_left_are_replaced_or_removed(tmp_path):
    dest = str(tmp_path / "fast")
    run_batches(make_files(tmp_path / "old", tag="old", shards=8), dest, "v1", 2)  # uploaded, never committed
    files = make_files(tmp_path / "out")
    receipt = publish_in_batches(files, dest, "v1", 2)
    one = publish(files, str(tmp_path / "one"), "ds", "v1", now=T0, names_from=tmp_path / "out")
    assert receipt["files"] == one["files"]
    assert snapshot(tmp_path / "fast") == snapshot(tmp_path / "one")  # no shard 6 or 7 of the other attempt


def test_on_s3_several_upload_jobs_publish_the_same_objects_send_nothing_verified_again_and_remove_strays(
    s3_server, s3_bucket, tmp_path, capsys
):
    files = make_files(tmp_path / "out")
    one = publish(files, f"s3://{s3_bucket}/one", "ds", "v1", s3=s3_server, now=T0, names_from=tmp_path / "out")
    dest = f"s3://{s3_bucket}/several"
    run_batches(make_files(tmp_path / "old", tag="old", shards=8), dest, "v1", 2, s3=s3_server)  # never committed
    plan, receipts = run_batches(files, dest, "v1", 3, s3=s3_server, skip={2})
    capsys.readouterr()
    # the last job was killed after sending one file: its rerun sends the rest, and verifies all
    plan, runs = plan_version(files, dest, "ds", "v1", 3, s3=s3_server, names_from=tmp_path / "out", now=T0)
    first = min(runs[2])
    upload_batch(plan, {first: runs[2][first]}, max(runs[1]), s3=s3_server)
    before = objects(s3_server, s3_bucket)
    receipts.append(upload_batch(plan, runs[2], max(runs[1]), s3=s3_server))
    # sent: what is not there with its size (the other attempt's objects of another size among them)
    missing = [n for n, e in runs[2].items() if before.get(f"several/ds/v1/{n}", (None,))[0] != e["size"]]
    assert first not in missing and len(missing) < len(runs[2])
    assert f"sent {len(missing)} of the batch's {len(runs[2])} files" in capsys.readouterr().out
    assert objects(s3_server, s3_bucket)[f"several/ds/v1/{first}"] == before[f"several/ds/v1/{first}"]
    assert latest_version(dest, "ds", s3_server) is None  # nothing committed yet
    receipt = commit_version(plan, receipts, s3=s3_server, now=T0)
    assert {k: v for k, v in receipt.items() if k != "dest"} == {k: v for k, v in one.items() if k != "dest"}
    after = objects(s3_server, s3_bucket)
    several = {k.removeprefix("several/"): v[:2] for k, v in after.items() if k.startswith("several/")}
    # size and ETag of every object, marker and latest included; shards 6 and 7 of the other attempt gone
    assert several == {k.removeprefix("one/"): v[:2] for k, v in after.items() if k.startswith("one/")}
    with pytest.raises(PublishConflict, match="already published with different content"):
        plan_version(make_files(tmp_path / "other", tag="x"), dest, "ds", "v1", 2, s3=s3_server)
    assert objects(s3_server, s3_bucket) == after
