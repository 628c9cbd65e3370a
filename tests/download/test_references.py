"""Evaluation sets' reference images hashed (shardsmith.download.references): a folder and tar shards give the
same hashes, an unreadable file is named and skipped, an empty set hashes nothing; the images hashed are packed
into a part for embedding, in the table's order; the config checks."""

import io
import json
import tarfile

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from shardsmith.cli.demo import jpeg, scene
from shardsmith.core.errors import ConfigError
from shardsmith.download.process.phash import phash_pair
from shardsmith.download.references import check_evaluation_sets, hash_references, pack_references
from shardsmith.formats.tario import read_member


def images(n: int = 3) -> dict[str, bytes]:
    rng = np.random.default_rng(5)
    return {f"img_{i}.jpg": jpeg(scene(rng, 160 + 16 * i, 120), quality=90) for i in range(n)}


def test_a_folder_and_tar_shards_of_the_same_images_hash_alike_and_an_unreadable_file_is_named(tmp_path):
    made = images()
    folder = tmp_path / "eval" / "sub"
    folder.mkdir(parents=True)
    for name, data in made.items():
        (folder / name).write_bytes(data)
    (folder / "broken.jpg").write_bytes(b"not an image")
    (folder / ".hidden.jpg").write_bytes(next(iter(made.values())))
    (folder / "notes.txt").write_text("not an image either")
    with tarfile.open(tmp_path / "eval-000000.tar", "w") as tar:
        for name, data in made.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    sets = [
        {"name": "folder", "path": str(tmp_path / "eval")},
        {"name": "shards", "path": str(tmp_path / "eval-{000000..000000}.tar")},
    ]
    info = hash_references(sets, str(tmp_path / "refs.parquet"), str(tmp_path / "refs.json"))
    table = pd.read_parquet(tmp_path / "refs.parquet")
    assert info["folder"]["images"] == 3 and info["shards"]["images"] == 3
    assert [u.split(":")[0] for u in info["folder"]["unreadable"]] == ["sub/broken.jpg"]
    assert json.loads((tmp_path / "refs.json").read_text()) == info
    folder_rows, shard_rows = table[table["set"] == 0], table[table["set"] == 1]
    assert list(folder_rows["key"]) == [f"folder/sub/{n}" for n in made]
    assert list(shard_rows["key"]) == [f"shards/eval-000000.tar/{n}" for n in made]
    assert set(table["version"]) == {"reference:folder", "reference:shards"}
    assert list(folder_rows["phash"]) == list(shard_rows["phash"])
    first = Image.open(io.BytesIO(made["img_0.jpg"])).convert("RGB")
    assert (folder_rows["phash"].iloc[0], folder_rows["phash_mirror"].iloc[0]) == phash_pair(first)
    assert (folder_rows["width_before"].iloc[2], folder_rows["height_before"].iloc[2]) == (192, 120)
    assert list(shard_rows["row"]) == [0, 1, 2]


def test_the_hashed_images_are_packed_as_a_part_in_the_tables_order_and_a_changed_set_is_refused(tmp_path):
    made = images(4)
    folder = tmp_path / "eval"
    folder.mkdir()
    for name, data in made.items():
        (folder / name).write_bytes(data)
    (folder / "broken.jpg").write_bytes(b"not an image")
    sets = [{"name": "val", "path": str(folder)}]
    hash_references(sets, str(tmp_path / "refs.parquet"), str(tmp_path / "refs.json"))
    tar, samples = str(tmp_path / "images.tar"), str(tmp_path / "images.samples.parquet")
    assert pack_references(sets, str(tmp_path / "refs.parquet"), tar, samples) == 4
    table = pd.read_parquet(samples)
    assert table["key"].tolist() == pd.read_parquet(tmp_path / "refs.parquet")["key"].tolist()
    assert table["key"].tolist() == [f"val/{n}" for n in sorted(made)]  # the unreadable file is not packed
    for key, row in zip(table["key"], table.to_dict("records"), strict=True):
        assert read_member(tar, row["jpg_offset"], row["jpg_size"]) == made[key.split("/", 1)[1]]
        assert row["txt_size"] == 0  # no caption
    with tarfile.open(tar) as t:  # a tar any reader takes
        assert len(t.getnames()) == 8
    (folder / "img_2.jpg").unlink()
    with pytest.raises(ValueError, match="evaluation set images changed since they were hashed: val/img_2.jpg"):
        pack_references(sets, str(tmp_path / "refs.parquet"), str(tmp_path / "x.tar"), str(tmp_path / "x.parquet"))
    assert not (tmp_path / "x.parquet").exists() and not (tmp_path / "x.tar").exists()


def test_an_empty_set_hashes_nothing(tmp_path):
    (tmp_path / "empty").mkdir()
    info = hash_references(
        [{"name": "e", "path": str(tmp_path / "empty")}], str(tmp_path / "r.parquet"), str(tmp_path / "r.json")
    )
    assert info == {"e": {"path": str(tmp_path / "empty"), "images": 0, "unreadable": []}}
    assert len(pd.read_parquet(tmp_path / "r.parquet")) == 0


def test_evaluation_sets_are_checked_in_one_line(tmp_path):
    (tmp_path / "eval").mkdir()
    ok = {"name": "val", "path": str(tmp_path / "eval")}
    check_evaluation_sets({"dedupe": {"near": "report"}, "evaluation_sets": [ok]})
    check_evaluation_sets({"dedupe": {"near": "off"}})  # none: nothing to check
    with pytest.raises(ConfigError, match="set dedupe.near to report or exclude"):
        check_evaluation_sets({"dedupe": {"near": "off"}, "evaluation_sets": [ok]})
    with pytest.raises(ConfigError, match="set names must differ"):
        check_evaluation_sets({"dedupe": {"near": "report"}, "evaluation_sets": [ok, ok]})
    with pytest.raises(ConfigError, match="neither a folder of images nor tar shards"):
        check_evaluation_sets(
            {"dedupe": {"near": "report"}, "evaluation_sets": [{"name": "x", "path": str(tmp_path / "no-*.tar")}]}
        )
