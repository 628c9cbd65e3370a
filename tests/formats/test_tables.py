"""Dataset-wide tables without holding them: bins on disk, repeated keys, parquet written a frame at a time."""

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import shardsmith.formats.tables as tables
from shardsmith.formats.tables import ParquetAppender, Spill, bins_for, key_bins, key_hashes, repeated_keys


def test_key_hashes_are_the_same_in_every_run_and_differ_between_keys():
    a = key_hashes(["k0", "k1", "k0"])
    assert a.dtype == np.uint64 and a[0] == a[2] != a[1]
    assert list(key_hashes(pd.Series(["k0", "k1"]))) == list(a[:2])
    assert int(key_hashes(["k0"])[0]) == int(pd.util.hash_array(np.array(["k0"], dtype=object))[0])


def test_key_bins_put_every_row_of_a_key_in_one_bin():
    keys = np.array([f"k{i % 37}" for i in range(500)], dtype=object)
    bins = key_bins(pa.array(keys), 7)
    assert set(bins) <= set(range(7)) and len(set(bins)) > 1
    for k in set(keys):
        assert len(set(bins[keys == k])) == 1
    assert set(key_bins(pa.array(keys), 1)) == {0}


def test_bins_for_keeps_bins_under_the_row_budget(monkeypatch):
    monkeypatch.setattr(tables, "BIN_ROWS", 10)
    assert [bins_for(n) for n in (0, 10, 11, 95)] == [1, 1, 2, 10]
    assert bins_for(10**9, most=512) == 512


@pytest.mark.parametrize("on_disk", [False, True])
def test_a_spill_gives_back_each_bins_rows_in_order(tmp_path, on_disk):
    schema = pa.schema([("key", pa.large_string()), ("pos", pa.int64())])
    spill = Spill(tmp_path / "bins" if on_disk else None, 3, schema)
    spill.add(pa.table({"key": ["a", "b", "c", "d"], "pos": [0, 1, 2, 3]}), np.array([2, 0, 2, 1]))
    spill.add(pa.table({"key": ["e", "f"], "pos": [4, 5]}), np.array([0, 2]))
    spill.close()
    if on_disk:
        got = [spill.read(i).to_pydict() for i in range(3)]
        assert got == [
            {"key": ["b", "e"], "pos": [1, 4]},
            {"key": ["d"], "pos": [3]},
            {"key": ["a", "c", "f"], "pos": [0, 2, 5]},
        ]
        assert len(list((tmp_path / "bins").glob("*.arrow"))) == 3
    else:  # one bin in memory: a single bin needs no files
        assert spill.n == 1 and spill.read(0).to_pydict()["pos"] == [0, 1, 2, 3, 4, 5]
        assert not (tmp_path / "bins").exists()


def write_tables(tmp_path, *keysets):
    paths = []
    for i, keys in enumerate(keysets):
        path = tmp_path / f"t{i}.parquet"
        pd.DataFrame({"key": keys, "n": range(len(keys))}).to_parquet(path, row_group_size=2)
        paths.append(str(path))
    return paths


@pytest.mark.parametrize("bin_rows", [1_000_000, 2])
def test_repeated_keys_across_tables_and_row_groups(tmp_path, monkeypatch, bin_rows):
    monkeypatch.setattr(tables, "BIN_ROWS", bin_rows)  # 2: keys sorted into 5 bins on disk
    paths = write_tables(tmp_path, ["a", "b", "c", "b"], ["d", "a", "e"], ["f"])
    assert repeated_keys(paths, tmp=tmp_path) == ["a", "b"]
    # every key hashing alike: all in one bin, and the keys themselves decide
    monkeypatch.setattr(tables, "key_hashes", lambda keys: np.zeros(len(keys), dtype=np.uint64))
    assert repeated_keys(paths, tmp=tmp_path) == ["a", "b"]
    assert repeated_keys(write_tables(tmp_path, ["x", "y", "z"]), tmp=tmp_path) == []
    assert not [p for p in tmp_path.iterdir() if p.is_dir()]  # the bins are cleaned up


def test_appender_keeps_the_first_frames_types_and_writes_only_on_close(tmp_path):
    path = tmp_path / "out.parquet"
    with ParquetAppender(path, ["key", "url", "n"]) as out:
        out.append(pd.DataFrame({"key": ["a"], "url": ["u"], "n": [1]}))
        out.append(pd.DataFrame({"key": [], "url": [], "n": []}))
        out.append(pd.DataFrame({"key": ["b", "c"], "url": [None, None], "n": [2, 3]}))  # an all-null column
        assert not path.exists()
    table = pq.read_table(path)
    assert out.rows == 3 and table.num_rows == 3
    assert table.to_pydict() == {"key": ["a", "b", "c"], "url": ["u", None, None], "n": [1, 2, 3]}


def test_appender_takes_arrow_tables_and_a_first_column_all_null_as_text(tmp_path):
    path = tmp_path / "out.parquet"
    src = tmp_path / "src.parquet"
    pd.DataFrame({"key": ["a"], "detail": [None]}).to_parquet(src, index=False)  # pandas metadata, a null column
    with ParquetAppender(path, ["key", "detail"]) as out:
        out.append(pq.read_table(src))
        out.append(pa.table({"key": ["b"], "detail": ["why"]}))  # refused by a null-typed column
        out.append(pd.DataFrame({"key": ["c"], "detail": ["how"]}))
    table = pq.read_table(path)
    assert table.to_pydict() == {"key": ["a", "b", "c"], "detail": [None, "why", "how"]}
    assert table.schema.field("detail").type == pa.string() and table.schema.metadata is None


def test_appender_without_rows_writes_the_columns_and_a_failure_leaves_nothing(tmp_path):
    with ParquetAppender(tmp_path / "empty.parquet", ["key", "stage"]):
        pass
    assert list(pd.read_parquet(tmp_path / "empty.parquet").columns) == ["key", "stage"]
    with pytest.raises(RuntimeError, match="stop"), ParquetAppender(tmp_path / "half.parquet", ["key"]) as out:
        out.append(pd.DataFrame({"key": ["a"]}))
        raise RuntimeError("stop")
    assert list(tmp_path.glob("*half*")) == []


def test_keys_spilled_into_a_scratch_folder_that_is_gone_make_it_and_leave_it_empty(tmp_path, monkeypatch):
    monkeypatch.setattr(tables, "BIN_ROWS", 2)  # bins on disk
    scratch = tmp_path / "work" / "tmp"  # cleaned away between runs: the job that spills makes it again
    assert repeated_keys(write_tables(tmp_path, ["a", "b", "c"], ["a", "d"]), tmp=scratch) == ["a"]
    assert scratch.is_dir() and not any(scratch.iterdir())


def test_key_digest_sums_do_not_depend_on_how_the_keys_are_split_or_ordered():
    keys = [f"laion-{i:09d}" for i in range(1000)] + ["", "a", "ab", "ba", "é-ü"]
    whole = tables.key_digest_sum(keys)
    assert tables.key_digest_sum(pa.array(keys)) == whole  # Arrow buffers and Python strings agree
    assert tables.key_digest_sum(pa.chunked_array([pa.array(keys[:7]), pa.array(keys[7:])])) == whole
    assert tables.key_digest_sum(pa.array(keys[::-1], pa.large_string())) == whole
    assert tables.key_digest_sum(pa.array(keys).slice(3, 50)) == tables.key_digest_sum(keys[3:53])  # an offset
    assert 0 <= whole < 2**64 and tables.key_digest_sum([]) == 0
    # a key twice, a key lost, two keys swapped for others of the same bytes: every one changes the sum
    assert tables.key_digest_sum([*keys, keys[5]]) != whole
    assert tables.key_digest_sum(keys[1:]) != whole
    assert tables.key_digest_sum(["ab", "ab"]) != tables.key_digest_sum(["ab", "ba"])
    assert tables.key_digest_sum(["a", "b"]) != tables.key_digest_sum(["ab"])


def piece(path, n: int, large: bool = False):
    kind = pa.large_string() if large else pa.string()
    pq.write_table(pa.table({"key": pa.array([f"{path.stem}-{i}" for i in range(n)], kind)}), path)
    return path


def test_a_table_in_pieces_is_linked_into_a_folder_that_replaces_the_last_whole(tmp_path):
    schema = pa.schema([("key", pa.string())])
    a, b = piece(tmp_path / "a.parquet", 3), piece(tmp_path / "b.parquet", 0)
    c = piece(tmp_path / "c.parquet", 2, large=True)  # another type: rewritten with the schema
    folder = tmp_path / "out" / "manifest.parquet"
    folder.parent.mkdir()
    folder.write_bytes(b"a single file from an earlier layout")
    assert tables.assemble_folder([("x-0.parquet", a), ("x-1.parquet", b), ("x-2.parquet", c)], folder, schema) == 5
    assert sorted(p.name for p in folder.iterdir()) == ["x-0.parquet", "x-1.parquet", "x-2.parquet"]
    assert (folder / "x-0.parquet").stat().st_ino == a.stat().st_ino  # linked, not read
    assert pq.read_schema(folder / "x-2.parquet").field("key").type == pa.string()
    assert pq.read_table(folder)["key"].to_pylist() == ["a-0", "a-1", "a-2", "c-0", "c-1"]
    assert tables.table_files(folder) == [str(folder / f"x-{i}.parquet") for i in range(3)]
    assert tables.num_rows(folder) == 5
    assert tables.assemble_folder([("y.parquet", c)], folder, schema) == 2  # the last folder replaced whole
    assert [p.name for p in folder.iterdir()] == ["y.parquet"]
    assert sorted(p.name for p in folder.parent.iterdir()) == ["manifest.parquet"]  # no temporary name left


def test_a_failed_assembly_leaves_the_last_folder_and_no_temporary_name(tmp_path):
    schema = pa.schema([("key", pa.string())])
    folder = tmp_path / "rejected.parquet"
    tables.assemble_folder([("0.parquet", piece(tmp_path / "a.parquet", 1))], folder, schema)
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet")
    with pytest.raises(pa.ArrowInvalid):
        tables.assemble_folder([("0.parquet", piece(tmp_path / "b.parquet", 4)), ("1.parquet", bad)], folder, schema)
    assert pq.read_table(folder)["key"].to_pylist() == ["a-0"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.parquet", "b.parquet", "bad.parquet", "rejected.parquet"]
