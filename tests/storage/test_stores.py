"""Complete versions and the `latest` pointer as readers see them (shardsmith.storage.stores), on a mounted path."""

import pytest

from shardsmith.publish.dataset import publish
from shardsmith.storage.stores import PublishError, complete_versions, latest_version, read_complete
from tests.publish.test_dataset import T0, make_files


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


@pytest.mark.parametrize("where", ["mounted", "s3"])
def test_a_folder_is_copied_whole_in_one_call(where, tmp_path, request):
    """copy_folder: every file below a version's folder (the manifest's pieces), on S3 in one CLI run."""
    from shardsmith.storage.stores import open_store

    out = tmp_path / "out"
    (out / "manifest.parquet").mkdir(parents=True)
    files = [str(out / "sizes.json")]
    (out / "sizes.json").write_text("{}")
    for i in range(3):
        (out / "manifest.parquet" / f"ds-{i:06d}.parquet").write_bytes(bytes([i]) * (100 + i))
        files.append(str(out / "manifest.parquet" / f"ds-{i:06d}.parquet"))
    if where == "s3":
        s3, bucket = request.getfixturevalue("s3_server"), request.getfixturevalue("s3_bucket")
        dest = f"s3://{bucket}/fast"
    else:
        s3, dest = None, str(tmp_path / "fast")
    publish(files, dest, "ds", "v1", s3=s3, names_from=out)
    store = open_store(dest, "ds", s3)
    store.copy_folder("v1/manifest.parquet", tmp_path / "got")
    got = sorted(p.name for p in (tmp_path / "got").iterdir())
    assert got == [f"ds-{i:06d}.parquet" for i in range(3)]
    assert all((tmp_path / "got" / n).read_bytes() == (out / "manifest.parquet" / n).read_bytes() for n in got)
    store.copy_folder("v1/no-such-folder", tmp_path / "none")  # nothing there: nothing copied, no error
    assert not (tmp_path / "none").exists() or not any((tmp_path / "none").iterdir())


def test_a_destination_through_a_file_is_refused_in_one_line(tmp_path, capsys):
    """`versions --dest` given a file's path (a published sizes.json): a one-line error, no traceback."""
    from shardsmith.__main__ import main

    dest = tmp_path / "fast"
    publish(make_files(tmp_path / "a"), str(dest), "ds", "v1", now=T0)
    sizes = dest / "ds" / "v1" / "sizes.json"
    assert sizes.is_file()
    with pytest.raises(PublishError, match="sizes.json is a file, not a folder"):
        complete_versions(str(sizes), "ds")
    assert main(["versions", "--dest", str(sizes), "--dataset", "ds"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"shardsmith: {sizes} is a file, not a folder")


def test_a_dataset_name_that_is_no_single_folder_name_is_refused_before_anything_is_written(tmp_path, capsys):
    """`publish --dataset ../x` put the version beside the destination, outside it; `a/b` one level down."""
    from shardsmith.__main__ import main

    files = [str(f) for f in make_files(tmp_path / "a")]
    dest = tmp_path / "fast" / "dest"
    for name in ("../escaped", "a/b", "", ".hidden"):
        with pytest.raises(PublishError, match="is not a dataset name"):
            complete_versions(str(dest), name)
        assert main(["publish", "--dest", str(dest), "--dataset", name, "--version", "v1", *files]) == 1
        assert capsys.readouterr().err.count("\n") == 1
        assert main(["versions", "--dest", str(dest), "--dataset", name]) == 1
        assert "is not a dataset name" in capsys.readouterr().err
    assert not (tmp_path / "fast").exists()
    assert main(["publish", "--dest", str(dest), "--dataset", "ds.v2-x", "--version", "v1", *files]) == 0
