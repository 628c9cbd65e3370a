"""What a version holds (shardsmith.publish.contents): the file table and its names, the fingerprint, auto versions."""

import datetime as dt

import pytest

from shardsmith.formats.build import BUILD_INFO
from shardsmith.publish.contents import auto_version, content_fingerprint, file_table
from shardsmith.storage.stores import MARKER
from tests.publish.test_dataset import make_files, make_nested


def test_build_json_alone_does_not_make_new_data():
    table = {"a.tar": {"size": 1, "sha256": "aa"}, BUILD_INFO: {"size": 5, "sha256": "bb"}}
    other_build = {**table, BUILD_INFO: {"size": 6, "sha256": "cc"}}
    assert content_fingerprint(table) == content_fingerprint(other_build)
    assert content_fingerprint(table) != content_fingerprint({**table, "a.tar": {"size": 1, "sha256": "ab"}})
    assert auto_version(table, dt.datetime(2026, 1, 2, 23, 30, tzinfo=dt.timezone(dt.timedelta(hours=-5)))).startswith(
        "2026-01-03-"
    )


def test_two_files_with_one_name_or_a_reserved_name_are_refused(tmp_path):
    a, b = make_files(tmp_path / "a"), make_files(tmp_path / "b")
    with pytest.raises(ValueError, match="share a name"):
        file_table([a[0], b[0]])
    (tmp_path / "latest").write_text("x")
    with pytest.raises(ValueError, match="written by publishing"):
        file_table([str(tmp_path / "latest")])


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


def test_a_folder_is_published_as_its_files_but_not_the_hidden_ones(tmp_path):
    """manifest.parquet/ is a directory output: Snakemake leaves .snakemake_timestamp in it, which no reader
    of the table reads and no version should hold."""
    out = tmp_path / "out"
    folder = out / "manifest.parquet"
    (folder / ".cache").mkdir(parents=True)
    for name in ("ds-000001.parquet", "ds-000000.parquet", ".snakemake_timestamp", ".cache/x"):
        (folder / name).write_bytes(name.encode())
    (out / "sizes.json").write_text("{}")
    table = file_table([str(folder), str(out / "sizes.json")], names_from=out)
    assert list(table) == ["manifest.parquet/ds-000000.parquet", "manifest.parquet/ds-000001.parquet", "sizes.json"]
