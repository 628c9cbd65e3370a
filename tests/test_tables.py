"""Dataset-wide tables without holding them: key hashes, repeated keys, parquet written a frame at a time."""

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

import shardsmith.tables as tables
from shardsmith.tables import ParquetAppender, dataset_key_hashes, key_hashes, repeated, repeated_keys


def test_key_hashes_are_the_same_in_every_run_and_differ_between_keys():
    a = key_hashes(["k0", "k1", "k0"])
    assert a.dtype == np.uint64 and a[0] == a[2] != a[1]
    assert list(key_hashes(pd.Series(["k0", "k1"]))) == list(a[:2])
    assert int(key_hashes(["k0"])[0]) == int(pd.util.hash_array(np.array(["k0"], dtype=object))[0])


def test_repeated_finds_every_position_of_a_repeated_hash():
    assert list(repeated(np.array([5, 1, 5, 2, 1, 9], dtype=np.uint64))) == [0, 1, 2, 4]
    assert list(repeated(np.array([3, 2, 1], dtype=np.uint64))) == []
    assert list(repeated(np.array([], dtype=np.uint64))) == []


def write_tables(tmp_path, *keysets):
    paths = []
    for i, keys in enumerate(keysets):
        path = tmp_path / f"t{i}.parquet"
        pd.DataFrame({"key": keys, "n": range(len(keys))}).to_parquet(path, row_group_size=2)
        paths.append(str(path))
    return paths


def test_hashes_come_in_table_and_row_order(tmp_path):
    paths = write_tables(tmp_path, ["a", "b", "c"], [], ["d", "a"])
    assert list(dataset_key_hashes(paths)) == list(key_hashes(["a", "b", "c", "d", "a"]))


def test_repeated_keys_across_tables_and_row_groups(tmp_path, monkeypatch):
    paths = write_tables(tmp_path, ["a", "b", "c", "b"], ["d", "a", "e"], ["f"])
    assert repeated_keys(paths) == ["a", "b"]
    # every key hashing alike: equal hashes are only candidates, the keys decide
    monkeypatch.setattr(tables, "key_hashes", lambda keys: np.zeros(len(keys), dtype=np.uint64))
    assert repeated_keys(paths) == ["a", "b"]
    assert repeated_keys(write_tables(tmp_path, ["x", "y", "z"])) == []


def test_appender_keeps_the_first_frames_types_and_writes_only_on_close(tmp_path):
    path = tmp_path / "out.parquet"
    with ParquetAppender(path, pd.DataFrame(columns=["key", "url", "n"])) as out:
        out.append(pd.DataFrame({"key": ["a"], "url": ["u"], "n": [1]}))
        out.append(pd.DataFrame({"key": [], "url": [], "n": []}))
        out.append(pd.DataFrame({"key": ["b", "c"], "url": [None, None], "n": [2, 3]}))  # an all-null column
        assert not path.exists()
    table = pq.read_table(path)
    assert out.rows == 3 and table.num_rows == 3
    assert table.to_pydict() == {"key": ["a", "b", "c"], "url": ["u", None, None], "n": [1, 2, 3]}


def test_appender_without_rows_writes_the_columns_and_a_failure_leaves_nothing(tmp_path):
    with ParquetAppender(tmp_path / "empty.parquet", pd.DataFrame(columns=["key", "stage"])):
        pass
    assert list(pd.read_parquet(tmp_path / "empty.parquet").columns) == ["key", "stage"]
    with pytest.raises(RuntimeError, match="stop"), ParquetAppender(tmp_path / "half.parquet", pd.DataFrame(columns=["key"])) as out:
        out.append(pd.DataFrame({"key": ["a"]}))
        raise RuntimeError("stop")
    assert list(tmp_path.glob("*half*")) == []
