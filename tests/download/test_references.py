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
from shardsmith.download.process.resize import ResizeSettings, process_image
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
    assert [u.split(":")[0] for u in info["folder"]["unreadable"]] == ["sub/broken.jpg", "sub/notes.txt"]
    assert json.loads((tmp_path / "refs.json").read_text()) == info
    folder_rows, shard_rows = table[table["set"] == 0], table[table["set"] == 1]
    assert list(folder_rows["key"]) == [f"folder/sub/{n}" for n in made]
    assert list(shard_rows["key"]) == [f"shards/eval-000000.tar/{n}" for n in made]
    assert set(table["version"]) == {"reference:folder", "reference:shards"}
    assert list(folder_rows["phash"]) == list(shard_rows["phash"])
    first = process_image(made["img_0.jpg"], ResizeSettings())  # as the image is hashed in the pool
    assert (folder_rows["phash"].iloc[0], folder_rows["phash_mirror"].iloc[0]) == (first.phash, first.phash_mirror)
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


def test_a_set_with_no_readable_image_is_an_error_naming_it(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"evaluation set e: no image could be read from .*empty$"):
        hash_references(
            [{"name": "e", "path": str(tmp_path / "empty")}], str(tmp_path / "r.parquet"), str(tmp_path / "r.json")
        )
    (tmp_path / "empty" / "labels.csv").write_text("a,b\n")
    with pytest.raises(ConfigError, match="no image could be read from .*; unreadable: labels.csv: not_an_image"):
        hash_references(
            [{"name": "e", "path": str(tmp_path / "empty")}], str(tmp_path / "r.parquet"), str(tmp_path / "r.json")
        )
    assert not (tmp_path / "r.parquet").exists()


def sideways(rng) -> bytes:
    """A photo stored on its side, upright by its EXIF orientation (6: rotate 90 degrees clockwise to show)."""
    exif = Image.Exif()
    exif[0x0112] = 6
    return jpeg(scene(rng, 200, 300).transpose(Image.Transpose.ROTATE_90), quality=92, exif=exif.tobytes())


def deep_png(rng) -> bytes:
    """A 16-bit greyscale PNG: convert("RGB") clips it to white."""
    grey = np.asarray(scene(rng, 240, 180).convert("L"), dtype=np.uint16) * 257
    buf = io.BytesIO()
    Image.fromarray(grey).save(buf, "PNG")
    return buf.getvalue()


def transparent_png(rng) -> bytes:
    """A PNG whose background is transparent: a sample is put on white, convert("RGB") keeps the hidden colour."""
    rgba = scene(rng, 220, 160).convert("RGBA")
    alpha = np.zeros((160, 220), dtype=np.uint8)
    alpha[40:120, 50:170] = 255
    rgba.putalpha(Image.fromarray(alpha))
    buf = io.BytesIO()
    rgba.save(buf, "PNG")
    return buf.getvalue()


@pytest.mark.parametrize("make", [sideways, deep_png, transparent_png])
def test_a_reference_is_hashed_and_packed_as_the_same_image_in_the_pool_is(tmp_path, make):
    data = make(np.random.default_rng(11))
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "ref.img").write_bytes(data)  # any name: every file of a folder is tried
    sets = [{"name": "val", "path": str(tmp_path / "eval")}]
    resize = {"max_side": 128, "quality": 85}
    hash_references(sets, str(tmp_path / "refs.parquet"), str(tmp_path / "refs.json"), resize)
    row = pd.read_parquet(tmp_path / "refs.parquet").iloc[0]
    sample = process_image(data, ResizeSettings(**resize))  # what download_part makes of a copy in the pool
    assert (row["phash"], row["phash_mirror"]) == (sample.phash, sample.phash_mirror)
    naive = phash_pair(Image.open(io.BytesIO(data)).convert("RGB"))  # the image as stored, not as shown
    assert bin(int(naive[0], 16) ^ int(row["phash"], 16)).count("1") > 8  # beyond the near-duplicate distance
    tar, samples = str(tmp_path / "images.tar"), str(tmp_path / "images.samples.parquet")
    pack_references(sets, str(tmp_path / "refs.parquet"), tar, samples, resize)
    packed = pd.read_parquet(samples).iloc[0]
    assert read_member(tar, packed["jpg_offset"], packed["jpg_size"]) == sample.data  # embedded as the sample is


def test_evaluation_sets_are_checked_in_one_line(tmp_path):
    (tmp_path / "eval").mkdir()
    ok = {"name": "val", "path": str(tmp_path / "eval")}
    check_evaluation_sets({"dedupe": {"near": "report"}, "evaluation_sets": [ok]})
    check_evaluation_sets({"dedupe": {"near": "off"}})  # none: nothing to check
    with pytest.raises(ConfigError, match="set dedupe.near to report or exclude"):
        check_evaluation_sets({"dedupe": {"near": "off"}, "evaluation_sets": [ok]})
    with pytest.raises(ConfigError, match="set names must differ"):
        check_evaluation_sets({"dedupe": {"near": "report"}, "evaluation_sets": [ok, ok]})
    for i in (0, 2):
        (tmp_path / f"val-{i:06d}.tar").write_bytes(b"")
    shards = {"name": "val", "path": str(tmp_path / "val-{000000..000002}.tar")}
    with pytest.raises(ConfigError, match=r"evaluation_sets val: 1 of the 3 shards .* are missing, the first .*01.tar"):
        check_evaluation_sets({"dedupe": {"near": "report"}, "evaluation_sets": [shards]})
    with pytest.raises(ConfigError, match="neither a folder of images nor tar shards"):
        check_evaluation_sets(
            {"dedupe": {"near": "report"}, "evaluation_sets": [{"name": "x", "path": str(tmp_path / "no-*.tar")}]}
        )


def test_one_image_or_a_cut_shard_as_a_set_is_refused_in_one_line(tmp_path):
    image = tmp_path / "val.jpg"
    image.write_bytes(jpeg(scene(np.random.default_rng(0), 64, 48)))
    for path in (image, tmp_path / "*.jpg"):
        with pytest.raises(ConfigError, match=r"^evaluation_sets val: .* names images \(.*val.jpg\), not tar shards"):
            check_evaluation_sets(
                {"dedupe": {"near": "report"}, "evaluation_sets": [{"name": "val", "path": str(path)}]}
            )
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for i in range(3):
            info = tarfile.TarInfo(f"{i}.jpg")
            info.size = len(image.read_bytes())
            tar.addfile(info, io.BytesIO(image.read_bytes()))
    (tmp_path / "cut.tar").write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])  # a copy that stopped
    (tmp_path / "junk.tar").write_bytes(b"not a tar" * 100)
    for name in ("cut.tar", "junk.tar"):
        with pytest.raises(ConfigError, match=rf"^evaluation set shard .*{name} cannot be read as a tar: [^\n]+$"):
            hash_references(
                [{"name": "val", "path": str(tmp_path / name)}], str(tmp_path / "r.parquet"), str(tmp_path / "r.json")
            )
    assert not (tmp_path / "r.parquet").exists()


def test_shards_of_one_name_in_two_folders_name_their_images_apart(tmp_path):
    """`{a,b}/val-000000.tar`: two images, two names, each packed (and embedded) as itself."""
    rng = np.random.default_rng(3)
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        data = jpeg(scene(rng, 64, 48))
        with tarfile.open(tmp_path / folder / "val-000000.tar", "w") as tar:
            info = tarfile.TarInfo("0.jpg")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    sets = [{"name": "val", "path": str(tmp_path / "{a,b}" / "val-000000.tar")}]
    hash_references(sets, str(tmp_path / "r.parquet"), str(tmp_path / "r.json"))
    table = pd.read_parquet(tmp_path / "r.parquet")
    assert list(table["key"]) == ["val/a/val-000000.tar/0.jpg", "val/b/val-000000.tar/0.jpg"]
    assert table["phash"].nunique() == 2
    assert pack_references(sets, str(tmp_path / "r.parquet"), str(tmp_path / "p.tar"), str(tmp_path / "p.parquet")) == 2
