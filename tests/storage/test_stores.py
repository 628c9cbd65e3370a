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
