"""Filters on manifest columns (shardsmith.download.filters): every comparison, empty cells, cells that are no
number, the config checks, a column a manifest lacks; through plan_parts (a headerless TSV's named column) and
download_part, whose loopback server counts the requests: a filtered record is never requested."""

import json

import numpy as np
import pandas as pd
import pytest
from generated import jpeg_bytes
from httpserver import Reply
from servers import ALLOW_LOOPBACK

from shardsmith.core.errors import ConfigError
from shardsmith.download.filters import FILTER_COLUMNS, apply_filters, check_columns, parse_filters
from shardsmith.download.part import download_part
from shardsmith.download.sources import plan_parts

LAION = {"name": "laion", "type": "manifest", "path": "x.parquet"}


def filters(*items: dict, sources=(LAION,)) -> list:
    return parse_filters(list(items), list(sources))


def verdicts(df: pd.DataFrame, *items: dict) -> list[str]:
    names, _ = apply_filters(df, filters(*items))
    return names


NUMBERS = pd.DataFrame({"p": [0.1, 0.5, 0.9, np.nan, None]})


@pytest.mark.parametrize(
    "op, value, failing",
    [
        ("<", 0.5, [False, True, True]),
        ("<=", 0.5, [False, False, True]),
        (">", 0.5, [True, True, False]),
        (">=", 0.5, [True, False, False]),
        ("==", 0.5, [True, False, True]),
        ("!=", 0.5, [False, True, False]),
        ("in", [0.1, 0.9], [False, True, False]),
        ("not_in", [0.1, 0.9], [True, False, True]),
    ],
)
def test_every_comparison_keeps_the_records_for_which_it_holds(op, value, failing):
    names = verdicts(NUMBERS, {"column": "p", "op": op, "value": value})
    assert [n == "p" for n in names[:3]] == failing
    assert names[3:] == ["p", "p"]  # NaN and None: empty cells fail by default


@pytest.mark.parametrize("column", ["int64", "object", "text"])
def test_integers_beyond_a_doubles_precision_are_compared_exactly(column):
    """Ids and hashes past 2^53 (a tweet's id, LAION's hash): a float64 would take the neighbours for the value."""
    big = 2**60 + 1
    ids = [big - 1, big, big + 1]
    df = pd.DataFrame({"id": pd.Series(ids, dtype="int64" if column == "int64" else object)})
    if column == "text":  # a CSV's cells
        df["id"] = df["id"].map(str)
    assert verdicts(df, {"column": "id", "op": "==", "value": big}) == ["id", "", "id"]
    assert verdicts(df, {"column": "id", "op": "!=", "value": big}) == ["", "id", ""]
    assert verdicts(df, {"column": "id", "op": "in", "value": [big, 5]}) == ["id", "", "id"]
    assert verdicts(df, {"column": "id", "op": "not_in", "value": [big]}) == ["", "id", ""]
    assert verdicts(df, {"column": "id", "op": ">", "value": big}) == ["id", "id", ""]
    assert verdicts(df, {"column": "id", "op": "<=", "value": big}) == ["", "", "id"]
    floats = pd.DataFrame({"x": np.array([1e20, 5e19], dtype="float32")})  # a float column: its own precision
    assert verdicts(floats, {"column": "x", "op": "==", "value": 1e20}) == ["", "x"]


def test_a_boolean_value_reads_every_writers_true_and_false():
    """pandas writes True, Spark and JSON true, a flag column 1: `value: false` keeps each writer's false."""
    df = pd.DataFrame({"nsfw": [True, False, "true", "FALSE", "1", 0, None, "maybe"]}, dtype=object)
    assert (
        verdicts(df, {"column": "nsfw", "op": "==", "value": False})
        == ["nsfw", "", "nsfw", "", "nsfw", ""] + ["nsfw"] * 2
    )
    assert (
        verdicts(df, {"column": "nsfw", "op": "!=", "value": True})
        == verdicts(df, {"column": "nsfw", "op": "not_in", "value": [True]})
        == verdicts(df, {"column": "nsfw", "op": "==", "value": False})
    )
    _, details = apply_filters(df, filters({"column": "nsfw", "op": "==", "value": False}))
    assert details[-1] == "nsfw is 'maybe', not true or false; kept: nsfw == False"


def test_empty_cells_fail_unless_kept_and_the_detail_says_so():
    df = pd.DataFrame({"p": [None, "", "  ", "0.2"]})
    names, details = apply_filters(df, filters({"column": "p", "op": "<", "value": 0.5}))
    assert names == ["p", "p", "p", ""]
    assert details[0] == "p is empty; kept: p < 0.5"
    kept = verdicts(df, {"column": "p", "op": "<", "value": 0.5, "keep_missing": True})
    assert kept == ["", "", "", ""]


def test_text_cells_read_as_numbers_and_a_cell_that_is_no_number_fails_naming_it():
    df = pd.DataFrame({"width": ["640", "120", "wide", "200.0"]})  # a TSV's cells are text
    names, details = apply_filters(df, filters({"column": "width", "op": ">=", "value": 200}))
    assert names == ["", "width", "width", ""]
    assert details[1] == "width is 120; kept: width >= 200"
    assert details[2] == "width is 'wide', not a finite number; kept: width >= 200"


def test_text_comparisons_and_sets():
    df = pd.DataFrame({"LANGUAGE": ["en", "de", "fr", None, "EN"]})
    assert verdicts(df, {"column": "LANGUAGE", "op": "in", "value": ["en", "de"]}) == [
        "",
        "",
        "language",
        "language",
        "language",
    ]
    assert verdicts(df, {"column": "LANGUAGE", "op": "==", "value": "en"})[:3] == ["", "language", "language"]
    assert verdicts(df, {"name": "not_fr", "column": "LANGUAGE", "op": "!=", "value": "fr"})[:3] == ["", "", "not_fr"]
    names, details = apply_filters(df, filters({"column": "LANGUAGE", "op": "not_in", "value": ["fr"]}))
    assert names[2] == "language" and details[2] == "LANGUAGE is fr; kept: LANGUAGE not_in [fr]"


def test_a_float32_column_is_compared_in_its_own_precision():
    # LAION's pwatermark and punsafe are float32: its 0.8 is 0.800000011920929 as a float64, above 0.8
    df = pd.DataFrame({"w": np.array([0.8, 0.7, 0.81, 6.7], dtype=np.float32)})
    assert verdicts(df, {"column": "w", "op": "<=", "value": 0.8}) == ["", "", "w", "w"]
    assert verdicts(df, {"column": "w", "op": ">=", "value": 6.7}) == ["w", "w", "w", ""]
    assert verdicts(df, {"column": "w", "op": "==", "value": 0.8}) == ["", "w", "w", "w"]
    assert verdicts(df, {"column": "w", "op": "in", "value": [0.7, 6.7]}) == ["w", "", "w", ""]
    _, details = apply_filters(df, filters({"column": "w", "op": "<", "value": 0.8}))
    assert details[0] == "w is 0.8; kept: w < 0.8"  # the cell as written, not 0.800000011920929


def test_whole_numbers_and_long_fractions_are_shown_as_written():
    df = pd.DataFrame({"id": [1000001.0, 2.5], "s": [0.27999, 0.3]})
    _, details = apply_filters(df, filters({"column": "id", "op": ">", "value": 1e7}))
    assert details[0] == "id is 1000001; kept: id > 10000000"
    _, details = apply_filters(df, filters({"column": "s", "op": ">=", "value": 0.28}))
    assert details[0] == "s is 0.27999; kept: s >= 0.28"


def test_null_words_in_text_cells_are_empty_cells_where_a_number_is_read_and_inf_is_no_number():
    df = pd.DataFrame({"p": ["nan", "NaN", "null", "None", "NA", "n/a", "0.2", "inf", "-Infinity"]})
    names, details = apply_filters(df, filters({"column": "p", "op": "<", "value": 0.5}))
    assert names == ["p"] * 6 + ["", "p", "p"]
    assert details[2] == "p is empty; kept: p < 0.5"
    assert details[7] == "p is 'inf', not a finite number; kept: p < 0.5"
    kept = verdicts(df, {"column": "p", "op": "<", "value": 0.5, "keep_missing": True})
    assert kept == [""] * 7 + ["p", "p"]


def test_text_cells_are_compared_without_their_surrounding_spaces():
    df = pd.DataFrame({"LANGUAGE": ["en ", " de", "fr"]})
    assert verdicts(df, {"column": "LANGUAGE", "op": "in", "value": ["en", "de"]}) == ["", "", "language"]
    assert verdicts(df, {"column": "LANGUAGE", "op": "==", "value": "en"}) == ["", "language", "language"]


def test_the_first_filter_a_record_fails_is_the_one_named():
    df = pd.DataFrame({"punsafe": [0.9, 0.1, 0.9, 0.1], "pwatermark": [0.9, 0.9, 0.1, 0.1]})
    names, details = apply_filters(
        df,
        filters(
            {"name": "unsafe", "column": "punsafe", "op": "<", "value": 0.5},
            {"name": "watermark", "column": "pwatermark", "op": "<", "value": 0.8},
        ),
    )
    assert names == ["unsafe", "watermark", "unsafe", ""]
    assert details[1] == "pwatermark is 0.9; kept: pwatermark < 0.8"


def test_config_checks_name_the_key():
    folder = {"name": "photos", "type": "folder", "path": "p"}
    cases = [
        ({"column": "p", "op": "in", "value": 0.5}, r"filters\[0\]\.value: 'in' takes a non-empty list"),
        ({"column": "p", "op": "<", "value": [1]}, "takes one value, got a list"),
        ({"column": "p", "op": "<", "value": "high"}, "'<' compares numbers"),
        ({"column": "p", "op": "<", "value": 1, "sources": ["nope"]}, "no source is named 'nope'"),
        ({"column": "p", "op": "<", "value": 1, "sources": ["photos"]}, "is a folder source"),
    ]
    for item, message in cases:
        with pytest.raises(ConfigError, match=message):
            parse_filters([item], [LAION, folder])
    with pytest.raises(ConfigError, match=r"filters\[0\] has the same name 'p'"):
        parse_filters([{"column": "p", "op": "<", "value": 1}, {"column": "p", "op": ">", "value": 0}], [LAION])
    with pytest.raises(ConfigError, match="no source is a manifest"):
        parse_filters([{"column": "p", "op": "<", "value": 1}], [folder])


def test_a_column_the_manifest_lacks_fails_naming_the_columns_it_has():
    with pytest.raises(
        ConfigError, match=r"names column 'punsafe', which manifest m.tsv lacks; its columns are \['url', 'caption'\]"
    ):
        check_columns(filters({"column": "punsafe", "op": "<", "value": 0.5}), "m.tsv", ["url", "caption"])


def test_plan_parts_marks_filtered_records_of_a_headerless_tsv_and_fails_early_on_a_missing_column(tmp_path):
    lines = ["http://a/1.jpg\tone\t0.9", "http://a/2.jpg\ttwo\t0.1", "http://a/3.jpg\tthree\t"]
    (tmp_path / "m.tsv").write_text("\n".join(lines) + "\n")
    src = {"name": "m", "type": "manifest", "path": str(tmp_path / "m.tsv"), "columns": ["url", "caption", "punsafe"]}
    other = {"name": "o", "type": "manifest", "path": str(tmp_path / "m.tsv"), "columns": ["url", "caption", "x"]}
    item = {"name": "safe", "column": "punsafe", "op": "<", "value": 0.5, "sources": ["m"]}
    [m, o] = plan_parts([src, other], 100, tmp_path / "parts", filters=[item])
    part = pd.read_parquet(tmp_path / "parts" / f"{m}.parquet")
    assert list(part["filter"]) == ["safe", "", "safe"]
    assert list(part["filter_detail"])[::2] == [
        "punsafe is 0.9; kept: punsafe < 0.5",
        "punsafe is empty; kept: punsafe < 0.5",
    ]
    assert not set(FILTER_COLUMNS) & set(pd.read_parquet(tmp_path / "parts" / f"{o}.parquet").columns)  # not its filter
    with pytest.raises(ConfigError, match=r"lacks; its columns are \['url', 'caption', 'x'\]"):
        plan_parts([src, other], 100, tmp_path / "again", filters=[{**item, "sources": None}])


def test_filtered_records_are_never_requested_and_end_with_their_filter(tmp_path, http_server):
    img = jpeg_bytes()
    rows = []
    for i, punsafe in enumerate([0.1, 0.9, None, 0.2, 0.7]):
        rows.append({"url": http_server.route(f"/{i}.jpg", Reply(body=img)), "caption": f"c{i}", "punsafe": punsafe})
    pd.DataFrame(rows).to_parquet(tmp_path / "m.parquet")
    src = {"name": "m", "type": "manifest", "path": str(tmp_path / "m.parquet")}
    [pid] = plan_parts([src], 100, tmp_path / "parts", filters=[{"column": "punsafe", "op": "<", "value": 0.5}])
    args = (
        str(tmp_path / "parts" / f"{pid}.parquet"),
        str(tmp_path / "raw" / "p.tar"),
        str(tmp_path / "raw" / "p.status.parquet"),
        src,
    )
    status = download_part(*args, settings=ALLOW_LOOPBACK)
    assert [http_server.count(f"/{i}.jpg") for i in range(5)] == [1, 0, 0, 1, 0]
    assert list(status["status"]) == ["ok", "filtered", "filtered", "ok", "filtered"]
    assert list(status["reason"]) == ["", "punsafe", "punsafe", "", "punsafe"]
    assert status["detail"][1] == "punsafe is 0.9; kept: punsafe < 0.5"
    # the filter loosened: the records it left out are fetched now, the others kept from the raw cache
    http_server.reset_counts()
    plan_parts([src], 100, tmp_path / "parts", filters=[{"column": "punsafe", "op": "<", "value": 0.8}])
    status = download_part(*args, settings=ALLOW_LOOPBACK)
    assert [http_server.count(f"/{i}.jpg") for i in range(5)] == [0, 0, 0, 0, 1]
    assert list(status["status"]) == ["ok", "filtered", "filtered", "ok", "ok"]


def test_an_id_list_keeps_the_records_it_lists_and_names_the_ids_no_record_has(tmp_path, caplog):
    rows = [{"url": f"http://a/{i}.jpg", "uid": f"u{i}"} for i in range(6)]
    pd.DataFrame(rows[:4]).to_parquet(tmp_path / "a.parquet")
    pd.DataFrame(rows[4:]).to_parquet(tmp_path / "b.parquet")
    (tmp_path / "subset.txt").write_text("u1\nu4\n\nu1\n  u5  \nu9\nmissing\n")  # u1 twice, a blank line, two unknown
    sources = [
        {"name": n, "type": "manifest", "path": str(tmp_path / f"{n}.parquet"), "key_column": "uid"} for n in "ab"
    ]
    item = {"name": "subset", "column": "uid", "op": "in_file", "value": str(tmp_path / "subset.txt")}
    with caplog.at_level("WARNING"):
        ids = plan_parts(sources, 100, tmp_path / "parts", filters=[item])
    parts = pd.concat(pd.read_parquet(tmp_path / "parts" / f"{i}.parquet") for i in ids)
    kept = parts.loc[parts["filter"] == "", "fields"].map(lambda f: json.loads(f)["uid"])
    assert list(kept) == ["u1", "u4", "u5"]  # the list matched across both sources
    assert parts["filter_detail"].iloc[0] == f"uid is u0; kept: uid in_file {tmp_path / 'subset.txt'}"
    report = json.loads((tmp_path / "parts" / "id_lists.json").read_text())["subset"]
    assert report == {
        "file": str(tmp_path / "subset.txt"), "ids_listed": 6, "ids": 5, "listed_more_than_once": 1, "matched": 3,
        "unknown": 2, "unknown_examples": ["u9", "missing"],
    }  # fmt: skip
    assert "5 ids (1 listed more than once); 3 match a record, 2 match none: u9, missing" in caplog.text


def test_a_parquet_id_list_leaves_out_what_it_lists_with_not_in_file(tmp_path):
    df = pd.DataFrame({"url": ["http://a/0.jpg", "http://a/1.jpg", "http://a/2.jpg"], "caption": ["x", "y", "z"]})
    pd.DataFrame({"url": ["http://a/1.jpg"], "reason": ["takedown"]}).to_parquet(tmp_path / "takedowns.parquet")
    item = {"name": "takedowns", "column": "url", "op": "not_in_file", "value": str(tmp_path / "takedowns.parquet")}
    assert verdicts(df, item) == ["", "takedowns", ""]  # the column named as the filter's, of several
    pd.DataFrame({"a": ["x"], "b": ["y"]}).to_parquet(tmp_path / "two.parquet")
    with pytest.raises(ConfigError, match=r"give it one column, or one named 'url'"):
        verdicts(df, {**item, "value": str(tmp_path / "two.parquet")})
    with pytest.raises(ConfigError, match=r"filters\[0\].value: 'in_file' takes an id list .* no such file"):
        filters({"column": "url", "op": "in_file", "value": str(tmp_path / "none.txt")})


def test_a_csv_id_list_is_read_by_its_header_and_a_parquet_folder_as_one_table(tmp_path):
    # a takedown list exported from a spreadsheet: a header, the id column, a reason; each line as a whole id
    # would match no record and publish every listed one
    df = pd.DataFrame({"uid": ["u0", "u1", "u2", "u3"], "url": [f"http://a/{i}.jpg" for i in range(4)]})
    (tmp_path / "takedowns.csv").write_text("uid,reason\nu1,request\nu3,copyright\n")
    item = {"name": "takedowns", "column": "uid", "op": "not_in_file", "value": str(tmp_path / "takedowns.csv")}
    assert verdicts(df, item) == ["", "takedowns", "", "takedowns"]
    (tmp_path / "ids.csv").write_text("id\nu2\n")  # one column, named otherwise
    assert verdicts(df, {**item, "value": str(tmp_path / "ids.csv")}) == ["", "", "takedowns", ""]
    (tmp_path / "subset.parquet").mkdir()  # as Spark and the published manifest write it
    for i, ids in enumerate((["u0"], ["u2"])):
        pd.DataFrame({"uid": ids}).to_parquet(tmp_path / "subset.parquet" / f"part-{i}.parquet")
    keep = {"name": "subset", "column": "uid", "op": "in_file", "value": str(tmp_path / "subset.parquet")}
    assert verdicts(df, keep) == ["", "subset", "", "subset"]


def test_an_id_list_in_a_format_without_text_ids_is_refused_naming_what_to_write(tmp_path):
    np.save(tmp_path / "uids.npy", np.array([[1, 2]], dtype=np.uint64))
    with pytest.raises(ConfigError, match=r"uids.npy: a NumPy or pickle file holds no text ids; write them as parquet"):
        filters({"column": "uid", "op": "in_file", "value": str(tmp_path / "uids.npy")})


@pytest.mark.parametrize("name", ["takedowns.txt", "takedowns.csv"])
def test_an_empty_id_list_lists_no_id(tmp_path, name):
    """A takedown list with nothing on it yet leaves out nothing; of a subset, it keeps nothing."""
    df = pd.DataFrame({"uid": ["u0", "u1"]})
    (tmp_path / name).write_text("")
    item = {"name": "takedowns", "column": "uid", "op": "not_in_file", "value": str(tmp_path / name)}
    assert verdicts(df, item) == ["", ""]
    assert verdicts(df, {**item, "op": "in_file"}) == ["takedowns", "takedowns"]


def test_an_id_list_that_cannot_be_read_is_one_line_naming_it(tmp_path):
    df = pd.DataFrame({"uid": ["u0"]})
    (tmp_path / "ids.parquet").write_text("u0\n")  # text under a parquet name
    (tmp_path / "folder").mkdir()
    item = {"name": "subset", "column": "uid", "op": "in_file", "value": str(tmp_path / "ids.parquet")}
    with pytest.raises(ConfigError, match=r"^id list .*ids.parquet cannot be read as parquet: [^\n]*$"):
        verdicts(df, item)
    with pytest.raises(ConfigError, match=r"^id list .*folder: the folder holds no parquet file\.$"):
        verdicts(df, {**item, "value": str(tmp_path / "folder")})


def test_an_integer_column_pandas_wrote_as_floats_matches_its_ids_as_text(tmp_path):
    """pandas writes an int column with an empty cell as float64: its 1000001.0 is the 1000001 a list names."""
    path = tmp_path / "m.parquet"
    pd.DataFrame({"uid": [1000001, None, 1000003]}).to_parquet(path)
    df = pd.read_parquet(path)
    assert df["uid"].dtype == "float64"
    (tmp_path / "ids.txt").write_text("1000001\n1000003\n")
    item = {"name": "subset", "column": "uid", "op": "in_file", "value": str(tmp_path / "ids.txt")}
    assert verdicts(df, item) == ["", "subset", ""]
    assert verdicts(df, {**item, "op": "in", "value": ["1000003"]}) == ["subset", "subset", ""]
    assert verdicts(df, {**item, "op": "==", "value": "1000001"}) == ["", "subset", "subset"]


def test_a_csv_id_lists_ids_are_read_as_written(tmp_path):
    """Never as numbers: img2dataset's zero-padded keys and an all-digit uid must match their records."""
    keys = ["000000123", "00000000000000000000000000001234", "12345678901234567890123456789012", "1e5"]
    (tmp_path / "takedowns.csv").write_text("key,reason\n" + "".join(f"{k},request\n" for k in keys))
    df = pd.DataFrame({"key": [*keys, "123"]})
    item = {"name": "takedowns", "column": "key", "op": "not_in_file", "value": str(tmp_path / "takedowns.csv")}
    assert verdicts(df, item) == ["takedowns"] * 4 + [""]


def test_a_tsv_id_list_is_a_table_as_a_csv_one_is(tmp_path):
    """A spreadsheet's tab-separated export: its header names the column; each line as an id would match none."""
    (tmp_path / "takedowns.tsv").write_text("reason\tuid\nrequest\t000123\ncopyright\tu3\n")
    df = pd.DataFrame({"uid": ["u0", "000123", "u3"]})
    item = {"name": "takedowns", "column": "uid", "op": "not_in_file", "value": str(tmp_path / "takedowns.tsv")}
    assert verdicts(df, item) == ["", "takedowns", "takedowns"]


def test_a_number_yaml_reads_as_text_is_refused_saying_how_to_write_it():
    """YAML 1.1 reads 1e-3 (no dot) as text: the message says so, not only that it is no number."""
    import yaml

    item = yaml.safe_load("{column: p, op: '<', value: 1e-3}")
    with pytest.raises(
        ConfigError,
        match=r"^filters\[0\].value: '<' compares numbers, got '1e-3' \(YAML reads 1e-3 as text: write 0.001\)\.$",
    ):
        filters(item)
    with pytest.raises(ConfigError, match=r"got 'high'\.$"):
        filters({**item, "value": "high"})
