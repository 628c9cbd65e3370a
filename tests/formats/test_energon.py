"""Megatron-Energon's prepared-dataset files: what `energon prepare` writes, from the members write_shard
recorded. The format tests run everywhere; those that run energon itself skip where it is not installed."""

import hashlib
import io
import json
import shutil
import sqlite3
import struct
import subprocess
import sys
import tarfile

import pytest
import yaml
from loader_helpers import needs_energon, read_with_energon, write_shards
from PIL import Image

from shardsmith.formats import energon
from shardsmith.shards.validate import loader_members

ENERGON_CLI = str(sys.executable).rsplit("/", 1)[0] + "/energon"


def prepare(folder, val_shards=0, counts=(3, 2, 2), sqlite=True):
    shards = write_shards(folder, counts=counts)
    for path, members in shards:
        energon.write_tar_index(path.with_name(energon.tar_index_name(path.name)), members)
    infos = [(p.name, len(energon.sample_spans(m)), hashlib.sha256(p.read_bytes()).hexdigest()) for p, m in shards]
    energon.write_meta(folder, infos, val_shards=val_shards)
    if sqlite:
        assert energon.write_sqlite(folder, [(p.name, m) for p, m in shards]) == sum(counts)
    return shards


def test_tar_index_holds_each_samples_header_offset_then_the_end_of_the_samples(tmp_path):
    for path, members in prepare(tmp_path / "out"):
        raw = path.with_name(path.name + ".idx").read_bytes()
        offsets = list(struct.unpack(f"<{len(raw) // 8}Q", raw))
        with tarfile.open(path) as tar:
            infos = tar.getmembers()
            end = tar.offset  # where the end-of-archive blocks start
        assert offsets == [m.offset for m in infos[::3]] + [end]
        assert energon.check_tar_index(path.with_name(path.name + ".idx"), loader_members(infos)) == []
        path.with_name(path.name + ".idx").write_bytes(raw[:-8])
        assert "first difference" in energon.check_tar_index(path.with_name(path.name + ".idx"), members)[0]


def test_meta_lists_every_shard_with_its_count_type_fields_and_a_train_split(tmp_path):
    out = tmp_path / "out"
    prepare(out)
    meta = out / ".nv-meta"
    assert sorted(p.name for p in meta.iterdir()) == [
        ".info.json",
        "dataset.yaml",
        "index.sqlite",
        "index.uuid",
        "split.yaml",
    ]
    info = json.loads((meta / ".info.json").read_text())
    assert info == {
        "energon_version": energon.FORMAT_VERSION,
        "shard_counts": {"ds-000000.tar": 3, "ds-000001.tar": 2, "ds-000002.tar": 2},
    }
    assert yaml.safe_load((meta / "split.yaml").read_text()) == {
        "split_parts": {"train": ["ds-{000000..000002}.tar"]},
        "exclude": [],
    }
    assert yaml.safe_load((meta / "dataset.yaml").read_text()) == {
        "sample_type": {"__module__": "megatron.energon", "__class__": "CaptioningSample"},
        "field_map": {"image": "jpg", "caption": "txt"},
    }
    db = sqlite3.connect(meta / "index.sqlite")
    samples = db.execute("SELECT tar_file_id, sample_key, sample_index FROM samples ORDER BY rowid").fetchall()
    assert samples == [
        (0, "src-000000000", 0),
        (0, "src-000000001", 1),
        (0, "src-000000002", 2),
        (1, "src-000000003", 0),
        (1, "src-000000004", 1),
        (2, "src-000000005", 0),
        (2, "src-000000006", 1),
    ]
    assert db.execute("SELECT COUNT(*) FROM sample_parts").fetchone() == (21,)
    assert energon.check_meta(out, info["shard_counts"]) == []


def test_held_out_shards_form_the_val_split_and_at_least_one_shard_trains(tmp_path):
    prepare(tmp_path / "a", val_shards=1)
    splits = yaml.safe_load((tmp_path / "a" / ".nv-meta" / "split.yaml").read_text())["split_parts"]
    assert splits == {"train": ["ds-{000000..000001}.tar"], "val": ["ds-000002.tar"]}
    with pytest.raises(energon.EnergonError, match="at least one must be left to train on"):
        prepare(tmp_path / "b", val_shards=3)


def test_meta_is_byte_identical_when_written_again_elsewhere(tmp_path):
    prepare(tmp_path / "a", val_shards=1)
    prepare(tmp_path / "b", val_shards=1)
    for name in (*energon.META_FILES, "ds-000000.tar.idx"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_check_meta_finds_counts_splits_and_index_that_disagree_with_sizes(tmp_path):
    out = tmp_path / "out"
    prepare(out)
    sizes = {"ds-000000.tar": 3, "ds-000001.tar": 2, "ds-000002.tar": 2}
    assert "shard_counts differ" in energon.check_meta(out, {**sizes, "ds-000002.tar": 5})[0]
    (out / ".nv-meta" / "split.yaml").write_text("split_parts:\n  train:\n  - ds-000000.tar\nexclude: []\n")
    assert any("every shard exactly once" in p for p in energon.check_meta(out, sizes))
    prepare(out)
    with sqlite3.connect(out / ".nv-meta" / "index.sqlite") as db:
        db.execute("DELETE FROM sample_parts WHERE part_name = 'txt' AND sample_index = 0")
    assert energon.check_meta(out, sizes) == [".nv-meta/index.sqlite: 4 txt parts for 7 samples"]


def test_sqlite_is_written_by_size_where_auto_and_as_told_otherwise():
    limit = energon.SQLITE_AUTO_SAMPLES
    assert energon.sqlite_wanted("auto", 12_423_374) and energon.sqlite_wanted("auto", limit)
    assert not energon.sqlite_wanted("auto", limit + 1) and not energon.sqlite_wanted("auto", 413_871_335)
    assert energon.sqlite_wanted(True, 5_850_000_000) and not energon.sqlite_wanted(False, 10)
    with pytest.raises(energon.EnergonError, match="not true, false or auto"):
        energon.sqlite_wanted("yes", 10)


def test_meta_without_sqlite_is_checked_without_it_and_a_missing_one_is_named_where_asked_for(tmp_path):
    out = tmp_path / "out"
    prepare(out, sqlite=False)
    assert not (out / ".nv-meta" / "index.sqlite").exists()
    sizes = {"ds-000000.tar": 3, "ds-000001.tar": 2, "ds-000002.tar": 2}
    assert energon.check_meta(out, sizes, sqlite=False) == []
    assert energon.check_meta(out, sizes) == [".nv-meta/index.sqlite: missing"]
    assert "shard_counts differ" in energon.check_meta(out, {**sizes, "ds-000002.tar": 5}, sqlite=False)[0]
    with_sqlite = tmp_path / "with"
    prepare(with_sqlite)
    for name in (".info.json", "split.yaml", "dataset.yaml", "index.uuid"):  # the same files but the index
        assert (out / ".nv-meta" / name).read_bytes() == (with_sqlite / ".nv-meta" / name).read_bytes(), name


@needs_energon
def test_files_match_what_energon_prepare_writes(tmp_path):
    ours = tmp_path / "ours"
    prepare(ours, val_shards=1)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    for tar in ours.glob("*.tar"):
        shutil.copy(tar, theirs / tar.name)
    cmd = [
        ENERGON_CLI,
        "prepare",
        "--non-interactive",
        "--num-workers",
        "1",
        "--split-parts",
        "train:ds-{000000..000001}.tar",
        "--split-parts",
        "val:ds-000002.tar",
        "--sample-type",
        "CaptioningSample",
        "--field-map",
        json.dumps(energon.FIELD_MAP),
        str(theirs),
    ]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)
    for name in (
        ".nv-meta/.info.json",
        ".nv-meta/split.yaml",
        ".nv-meta/dataset.yaml",
        *(f"{t.name}.idx" for t in ours.glob("*.tar")),
    ):
        assert (ours / name).read_bytes() == (theirs / name).read_bytes(), name
    for query in ("SELECT * FROM samples ORDER BY rowid", "SELECT * FROM sample_parts ORDER BY rowid",
                  "SELECT type, name, tbl_name FROM sqlite_master ORDER BY name"):  # fmt: skip
        rows = [sqlite3.connect(d / ".nv-meta" / "index.sqlite").execute(query).fetchall() for d in (ours, theirs)]
        assert rows[0] == rows[1], query


@needs_energon
def test_energon_loader_reads_every_sample_with_image_and_caption_and_lint_passes(tmp_path):
    out = tmp_path / "out"
    shards = prepare(out, val_shards=1)
    want = {}
    for path, _ in shards:
        with tarfile.open(path) as tar:
            for m in tar.getmembers()[::3]:
                key = m.name.split(".")[0]
                image = Image.open(io.BytesIO(tar.extractfile(m).read()))
                want[key] = ((3, image.height, image.width), tar.extractfile(f"{key}.txt").read().decode())
    train, val = read_with_energon(str(out), "train"), read_with_energon(str(out), "val")
    assert {**train, **val} == want and len(val) == 2
    lint = subprocess.run(
        [ENERGON_CLI, "lint", str(out), "--split-parts", "train,val"], capture_output=True, text=True, timeout=300
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr


@needs_energon
def test_without_sqlite_energon_trains_and_lints_every_sample_and_its_prepare_writes_the_same_index(tmp_path):
    out = tmp_path / "out"
    shards = prepare(out, val_shards=1, sqlite=False)
    keys = set()
    for path, _ in shards:
        with tarfile.open(path) as tar:
            keys |= {m.name.split(".")[0] for m in tar.getmembers()[::3]}
    train, val = read_with_energon(str(out), "train"), read_with_energon(str(out), "val")
    assert set(train) | set(val) == keys and not set(train) & set(val) and len(val) == 2
    lint = subprocess.run(
        [ENERGON_CLI, "lint", str(out), "--split-parts", "train,val"], capture_output=True, text=True, timeout=300
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr
    assert not (out / ".nv-meta" / "index.sqlite").exists()
    # A user who needs the index later (to join datasets): Energon writes it from the shards themselves.
    cmd = [ENERGON_CLI, "prepare", "--non-interactive", "--tar-index-only", "--num-workers", "1", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)
    ours = tmp_path / "ours"
    prepare(ours, val_shards=1)
    for query in ("SELECT * FROM samples ORDER BY rowid", "SELECT * FROM sample_parts ORDER BY rowid"):
        rows = [sqlite3.connect(d / ".nv-meta" / "index.sqlite").execute(query).fetchall() for d in (ours, out)]
        assert rows[0] == rows[1], query
