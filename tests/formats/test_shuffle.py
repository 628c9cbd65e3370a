"""The shuffle between map and reduce jobs (shardsmith.formats.shuffle): a table cut by bucket, read back a
bucket at a time from many files, in file and row order."""

import numpy as np
import pyarrow as pa
import pytest

from shardsmith.formats.shuffle import cut, read_all, read_bucket, read_meta, write_buckets, write_cut

SCHEMA = pa.schema([("id", pa.int64()), ("key", pa.large_string())])


def table(ids):
    return pa.table({"id": pa.array(ids, pa.int64()), "key": pa.array([f"k{i}" for i in ids], pa.large_string())})


def test_cut_keeps_each_buckets_rows_in_their_order():
    pieces = cut(table([5, 1, 4, 2, 3]), np.array([1, 0, 1, 2, 0]), 4)
    assert [p["id"].to_pylist() for p in pieces] == [[1, 3], [5, 4], [2], []]


def test_bucket_i_of_every_file_in_file_order_and_nothing_else(tmp_path):
    a, b = tmp_path / "a.arrow", tmp_path / "b.arrow"
    write_cut(a, SCHEMA, table([0, 1, 2, 3]), np.array([2, 0, 2, 0]), 3, {"samples": 4})
    write_buckets(b, SCHEMA, iter([table([10]), table([]), table([11, 12])]))  # a generator: one piece at a time
    assert read_bucket([a, b], 0, SCHEMA)["id"].to_pylist() == [1, 3, 10]
    assert read_bucket([a, b], 1, SCHEMA).num_rows == 0 and read_bucket([a, b], 1, SCHEMA).schema == SCHEMA
    assert read_bucket([b, a], 2, SCHEMA)["id"].to_pylist() == [11, 12, 0, 2]
    assert read_bucket(a, 2, SCHEMA)["key"].to_pylist() == ["k0", "k2"]  # one path
    assert read_all(a, SCHEMA)["id"].to_pylist() == [1, 3, 0, 2]
    assert read_meta(a) == {"samples": 4} and read_meta(b) == {}
    assert read_bucket([], 0, SCHEMA).num_rows == 0


def test_a_file_with_fewer_buckets_is_refused_with_what_to_do(tmp_path):
    path = tmp_path / "a.arrow"
    write_cut(path, SCHEMA, table([1]), np.array([0]), 2)
    with pytest.raises(ValueError, match="has 2 batches, not 3: split it again"):
        read_bucket([path], 2, SCHEMA, "split it again")


def test_a_killed_write_leaves_no_file(tmp_path):
    path = tmp_path / "a.arrow"

    def pieces():
        yield table([1])
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        write_buckets(path, SCHEMA, pieces())
    assert list(tmp_path.iterdir()) == []
