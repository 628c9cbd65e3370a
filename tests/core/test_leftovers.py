"""Leftovers of killed runs: the temporary names the workflow's own writers make are found and removed,
and nothing else is, whatever it is called."""

import os
import tempfile
from pathlib import Path

import pytest

from shardsmith.core import atomic
from shardsmith.core.leftovers import find_leftovers, remove_leftovers, use_scratch
from shardsmith.download.rawcache import link_or_copy


def killed_atomic_write(path: Path) -> Path:
    """The temporary file atomic_open leaves when its job is killed mid-write (no clean-up runs)."""
    names = set(os.listdir(path.parent)) if path.parent.exists() else set()

    class Killed(BaseException):
        pass

    unlink = os.unlink
    os.unlink = lambda p: None  # a SIGKILL runs no except clause: keep the file the clean-up would remove
    try:
        with pytest.raises(Killed), atomic.atomic_open(path) as f:
            f.write(b"half a shard")
            raise Killed
    finally:
        os.unlink = unlink
    (new,) = set(os.listdir(path.parent)) - names
    return path.parent / new


def test_the_workflows_temporary_names_are_found_and_nothing_else(tmp_path):
    out = tmp_path / "results" / "ds"
    made = [
        killed_atomic_write(out / "ds-000000.tar"),
        killed_atomic_write(tmp_path / "work" / "ds" / "processed" / "web-000000.samples.parquet"),
        Path(tempfile.mkdtemp(prefix=".v3.", suffix=".partial", dir=out)),  # a killed local publish
        Path(tempfile.mkdtemp(prefix=".v1.", suffix=".deleting", dir=out)),  # a killed retention delete
        Path(tempfile.mkdtemp(prefix=".spill-", dir=out)),  # a killed job's bins
        Path(tempfile.mkdtemp(prefix="shardsmith-readback-", dir=tmp_path / "work")),  # publish scratch
        tmp_path / "cache" / "ds" / ".keep" / f".web-000000.tar.{os.getpid()}.tmp",  # a raw-cache link
    ]
    made[-1].parent.mkdir(parents=True)
    made[-1].write_bytes(b"x")
    (made[2] / "ds-000000.tar").write_bytes(b"inside a partial version")
    theirs = [
        out / "notes.tmp",
        out / ".cache",
        out / ".x.tmp",
        out / "x.abcdefgh.tmp",
        out / ".x.ABCDEFGH.tmp",
        out / ".x.abcdefg.tmp",
        tmp_path / "work" / "shardsmith-readback",
        tmp_path / "work" / "shardsmith-other-abcdefgh",
    ]
    for p in theirs:
        p.mkdir() if "shardsmith" in p.name else p.write_bytes(b"mine")
    assert sorted(find_leftovers([tmp_path])) == sorted(made)
    assert sorted(remove_leftovers([tmp_path])) == sorted(made)
    assert not any(p.exists() for p in made) and all(p.exists() for p in theirs)
    assert find_leftovers([tmp_path]) == []


def test_depth_one_looks_beside_the_versions_not_inside_them(tmp_path):
    root = tmp_path / "fast" / "ds"
    (root / "v1").mkdir(parents=True)
    inside = root / "v1" / ".latest.abcdefgh.tmp"  # not ours to judge: a published version is never touched
    inside.write_bytes(b"x")
    beside = root / ".latest.abcd1234.tmp"
    beside.write_bytes(b"x")
    assert remove_leftovers([root], depth=1) == [beside] and inside.exists()


def test_links_are_not_followed(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / ".a.tar.abcdefgh.tmp").write_bytes(b"not this run's")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "link").symlink_to(elsewhere)
    assert find_leftovers([tmp_path / "out"]) == []


def test_linking_a_kept_file_again_leaves_no_temporary_name(tmp_path):
    src = tmp_path / "web-000000.tar"
    src.write_bytes(b"raw")
    keep = tmp_path / ".keep"
    keep.mkdir()
    for _ in range(3):  # every rerun of the part links the same file again
        link_or_copy(src, keep / src.name)
    assert os.listdir(keep) == [src.name] and os.path.samefile(src, keep / src.name)


def test_scratch_is_the_processs_temporary_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", tempfile.tempdir)
    monkeypatch.setenv("TMPDIR", os.environ.get("TMPDIR", "/tmp"))
    use_scratch(tmp_path / "work" / "tmp")
    with tempfile.TemporaryDirectory(prefix="shardsmith-publish-") as d:
        assert Path(d).parent == tmp_path / "work" / "tmp" and os.environ["TMPDIR"] == str(tmp_path / "work" / "tmp")


@pytest.mark.workflow
def test_a_rerun_after_kills_at_every_stage_leaves_no_temporary_name(tmp_path, monkeypatch):
    from workflow_helpers import demo_config, run_workflow

    from shardsmith.cli.demo import make_demo

    data, root = tmp_path / "data", tmp_path / "run"
    make_demo(data)
    config = demo_config(data, root)
    # The runs' own system temp folder, so that tests running beside this one leave nothing in it.
    system_tmp = tmp_path / "system-tmp"
    system_tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(system_tmp))
    run_workflow(root, config)
    raw, work, out = root / "raw" / "demo", root / "work" / "demo", root / "output" / "demo"
    dest = root / "fast-storage" / "demo"
    # What a kill leaves at each stage, made by the writers themselves: download (the part tar, a .keep
    # link), process (a part), plan_shards (a plan, its bins), write_shard (a shard), index_shards (an index
    # file), publish_dataset (a partial version, its scratch folder), retention (a version being deleted).
    left = [
        killed_atomic_write(raw / "cc3m_style-000000.tar"),
        killed_atomic_write(work / "processed" / "photos-000000.tar"),
        killed_atomic_write(work / "plan" / "shards" / "demo-000000.samples.parquet"),
        killed_atomic_write(out / "demo-000001.tar"),
        killed_atomic_write(out / "manifest.parquet"),
        Path(tempfile.mkdtemp(prefix=".spill-", dir=work / "plan")),
        Path(tempfile.mkdtemp(prefix=".v2.", suffix=".partial", dir=dest)),
        Path(tempfile.mkdtemp(prefix=".v0.", suffix=".deleting", dir=dest)),
        Path(tempfile.mkdtemp(prefix="shardsmith-publish-", dir=work / "tmp")),
        raw / ".keep" / ".cc3m_style-000000.tar.4242.tmp",
    ]
    left[-1].write_bytes(b"x")
    mine = out / ".my-notes.tmp"  # a user's file that looks temporary, but is no name of the workflow's
    mine.write_bytes(b"keep me")
    # The run was killed before it finished (a killed job never wrote its output), so the rerun has work:
    # here the publish, whose killed attempt left the partial version.
    (work / "published" / "v1.json").unlink()
    proc = run_workflow(root, config)
    assert f"removed {len(left)} temporary names a killed run left" in proc.stdout + proc.stderr
    assert not any(p.exists() for p in left) and mine.exists()
    mine.unlink()
    assert find_leftovers([root]) == []
    assert not any(system_tmp.glob("shardsmith-*"))  # publish's scratch is in work/
    assert not any((work / "tmp").iterdir())
