"""shardsmith.storage.localfiles: local inputs opened with a ledger reason, named as the run's folder sees them."""

import os

import pytest

from shardsmith.storage.localfiles import FetchError, open_source, shown_path


def test_a_path_in_the_runs_folder_is_shown_relative_to_it_and_others_as_given(tmp_path, monkeypatch):
    """A ledger detail naming the absolute path would differ between two builds of the same inputs in two folders."""
    monkeypatch.chdir(tmp_path)
    assert shown_path(str(tmp_path / "images" / "a.jpg")) == os.path.join("images", "a.jpg")
    assert shown_path("images/a.jpg") == "images/a.jpg"
    assert shown_path("/etc/hostname") == "/etc/hostname"
    assert shown_path(str(tmp_path) + "-other/a.jpg") == str(tmp_path) + "-other/a.jpg"  # a sibling, not inside


@pytest.mark.parametrize("how", ["relative", "absolute", "file_url"])
def test_a_missing_file_in_the_runs_folder_is_named_relative_to_it(tmp_path, monkeypatch, how):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "sub").mkdir()
    url = {
        "relative": "images/missing.jpg",
        "absolute": str(tmp_path / "images" / "missing.jpg"),
        "file_url": f"file://{tmp_path / 'images' / 'missing.jpg'}",
    }[how]
    with pytest.raises(FetchError) as e:
        open_source(url)
    assert (e.value.reason, e.value.detail) == ("not_found", "no such file: images/missing.jpg")
    with pytest.raises(FetchError) as e:
        open_source(url.replace("missing.jpg", "sub"))
    assert (e.value.reason, e.value.detail) == ("unreadable", "is a folder, not a file: images/sub")
