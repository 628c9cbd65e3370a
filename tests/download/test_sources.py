"""Planning: every source split deterministically into part parquets of records."""

import gzip
import json
import os

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from httpserver import Reply
from servers import ALLOW_LOOPBACK

from shardsmith.core.errors import ConfigError
from shardsmith.core.keys import make_key
from shardsmith.download import sources
from shardsmith.download.sources import HOST_RECORDS_TOGETHER, RECORD_COLUMNS, plan_parts, url_host
from shardsmith.storage.localfiles import open_source


def manifest(name: str, path, **extra) -> dict:
    return {"name": name, "type": "manifest", "path": str(path), "url_column": "url", **extra}


def plan(tmp_path, *sources, part_size: int = 100) -> tuple[list[str], dict[str, pd.DataFrame]]:
    out = tmp_path / "parts"
    ids = plan_parts(list(sources), part_size, out)
    return ids, {i: pd.read_parquet(out / f"{i}.parquet") for i in ids}


def fields(df: pd.DataFrame) -> list[dict]:
    return [json.loads(f) for f in df["fields"]]


def test_headerless_tsv_uses_declared_column_order_cc3m(tmp_path):
    (tmp_path / "cc3m.tsv").write_text('a "quoted" dog\thttp://x/1.jpg\nA cat, sitting\thttp://x/2.jpg\n')
    ids, parts = plan(tmp_path, manifest("cc3m", tmp_path / "cc3m.tsv", columns=["caption", "url"]))
    df = parts["cc3m-000000"]
    assert ids == ["cc3m-000000"] and list(df.columns) == RECORD_COLUMNS
    assert list(df["url"]) == ["http://x/1.jpg", "http://x/2.jpg"]
    assert fields(df)[0] == {"caption": 'a "quoted" dog', "url": "http://x/1.jpg"}
    assert list(df["key"]) == ["cc3m-cc3m-000000000", "cc3m-cc3m-000000001"]
    assert list(df["source_id"]) == [f"{tmp_path / 'cc3m.tsv'}:1", f"{tmp_path / 'cc3m.tsv'}:2"]


def test_headerless_tsv_uses_declared_column_order_cc12m(tmp_path):
    (tmp_path / "cc12m.tsv").write_text("http://x/1.jpg\tfirst caption\nhttp://x/2.jpg\tsecond\n")
    _, parts = plan(tmp_path, manifest("cc12m", tmp_path / "cc12m.tsv", columns=["url", "caption"]))
    df = parts["cc12m-000000"]
    assert list(df["url"]) == ["http://x/1.jpg", "http://x/2.jpg"]
    assert [f["caption"] for f in fields(df)] == ["first caption", "second"]


def test_a_tsvs_quotes_are_text_unless_its_quoting_is_csv(tmp_path):
    (tmp_path / "m.tsv").write_text('"a ""b"" c"\thttp://x/1.jpg\n"say"\thttp://x/2.jpg\n')
    src = manifest("m", tmp_path / "m.tsv", columns=["caption", "url"])
    _, parts = plan(tmp_path, src)
    assert [f["caption"] for f in fields(parts["m-000000"])] == ['"a ""b"" c"', '"say"']  # CC3M's way: literal
    _, parts = plan(tmp_path / "csv", {**src, "quoting": "csv"})
    assert [f["caption"] for f in fields(parts["m-000000"])] == ['a "b" c', "say"]


def test_gzipped_csv_with_header_is_read_with_quoting(tmp_path):
    path = tmp_path / "m.csv.gz"
    pd.DataFrame({"url": ["a.jpg", "b.jpg"], "caption": ['say "hi", twice', ""]}).to_csv(path, index=False)
    _, parts = plan(tmp_path, manifest("gz", path))
    df = parts["gz-000000"]
    assert list(df["url"]) == ["a.jpg", "b.jpg"]
    assert fields(df) == [{"caption": 'say "hi", twice', "url": "a.jpg"}, {"caption": "", "url": "b.jpg"}]
    assert list(df["key"]) == ["gz-m-000000000", "gz-m-000000001"]


def test_spaces_around_a_url_cell_are_not_part_of_the_url(tmp_path):
    """As browsers read a URL: kept, a leading space hides the scheme and a trailing one becomes part of the path."""
    (tmp_path / "m.tsv").write_text("cap one\t http://x/1.jpg\ncap two\thttp://x/2.jpg  \ncap three\t \n")
    _, parts = plan(tmp_path, manifest("sp", tmp_path / "m.tsv", columns=["caption", "url"]))
    assert list(parts["sp-000000"]["url"]) == ["http://x/1.jpg", "http://x/2.jpg", ""]


def test_jsonl_records_keep_nested_fields_and_missing_url_becomes_empty(tmp_path):
    rows = [{"url": "a.jpg", "caption": "one", "meta": {"w": 3}}, {"url": None, "caption": "two"}]
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    _, parts = plan(tmp_path, manifest("js", tmp_path / "m.jsonl"))
    df = parts["js-000000"]
    assert list(df["url"]) == ["a.jpg", ""]
    assert fields(df)[0] == {"caption": "one", "meta": {"w": 3}, "url": "a.jpg"}


def test_parquet_key_column_gives_keys_and_is_carried_into_fields(tmp_path):
    path = tmp_path / "m.parquet"
    pd.DataFrame({"uid": ["u.1", "u/2"], "url": ["a.jpg", "b.jpg"], "caption": ["x", "y"]}).to_parquet(path)
    _, parts = plan(tmp_path, manifest("pq", path, key_column="uid"))
    df = parts["pq-000000"]
    assert list(df["key"]) == [make_key("pq", "u.1"), make_key("pq", "u/2")] == ["pq-u_1", "pq-u_2"]
    assert fields(df)[1] == {"caption": "y", "uid": "u/2", "url": "b.jpg"}


def test_a_float_key_column_of_whole_numbers_gives_the_keys_of_the_integers(tmp_path):
    """pandas writes an integer id column with an empty cell as float64: its 1000001.0 is the id 1000001."""
    path = tmp_path / "m.parquet"
    pd.DataFrame(
        {"uid": [1000001, None, 7.5], "url": ["a.jpg", "b.jpg", "c.jpg"], "caption": ["x", "y", "z"]}
    ).to_parquet(path)
    _, parts = plan(tmp_path, manifest("pq", path, key_column="uid"))
    keys = list(parts["pq-000000"]["key"])
    assert keys[0] == "pq-1000001" and keys[2] == make_key("pq", "7.5") and keys[1].startswith("pq-")


def test_carry_columns_limit_the_fields(tmp_path):
    path = tmp_path / "m.parquet"
    pd.DataFrame({"url": ["a.jpg"], "caption": ["x"], "secret": ["s"]}).to_parquet(path)
    _, parts = plan(tmp_path, manifest("pq", path, carry_columns=["caption"]))
    assert fields(parts["pq-000000"]) == [{"caption": "x"}]


def test_parts_have_part_size_records_with_rids_from_zero(tmp_path):
    (tmp_path / "m.tsv").write_text("".join(f"cap {i}\t{i}.jpg\n" for i in range(25)))
    ids, parts = plan(tmp_path, manifest("big", tmp_path / "m.tsv", columns=["caption", "url"]), part_size=10)
    assert ids == ["big-000000", "big-000001", "big-000002"]
    assert [len(parts[i]) for i in ids] == [10, 10, 5]
    for i in ids:
        assert list(parts[i]["rid"]) == list(range(len(parts[i])))
        assert set(parts[i]["source"]) == {"big"}
    all_urls = [u for i in ids for u in parts[i]["url"]]
    assert all_urls == [f"{i}.jpg" for i in range(25)]


def test_parts_never_span_two_manifest_files_of_a_glob(tmp_path):
    (tmp_path / "a.tsv").write_text("".join(f"c\ta{i}.jpg\n" for i in range(3)))
    (tmp_path / "b.tsv").write_text("".join(f"c\tb{i}.jpg\n" for i in range(4)))
    ids, parts = plan(tmp_path, manifest("two", tmp_path / "*.tsv", columns=["caption", "url"]), part_size=5)
    assert ids == ["two-000000", "two-000001"]
    assert list(parts["two-000000"]["url"]) == ["a0.jpg", "a1.jpg", "a2.jpg"]
    assert list(parts["two-000001"]["url"]) == ["b0.jpg", "b1.jpg", "b2.jpg", "b3.jpg"]
    assert list(parts["two-000001"]["rid"]) == [0, 1, 2, 3]


def rows_of(df: pd.DataFrame) -> list[int]:
    return [int(s.rsplit(":", 1)[1]) for s in df["source_id"]]


def test_a_hosts_few_records_share_one_part_in_manifest_order(tmp_path):
    # 20 hosts of 3 records each, interleaved (row r on host r % 20): consecutive parts of 10 would put every
    # host in 3 parts, each paying a lookup, a handshake and the policy cache again
    lines = [f"cap {r}\thttps://h{r % 20}.example:8443/{r}.jpg\n" for r in range(60)]
    (tmp_path / "m.tsv").write_text("".join(lines))
    src = manifest("web", tmp_path / "m.tsv", columns=["caption", "url"])
    ids, parts = plan(tmp_path, src, part_size=10)
    assert [len(parts[i]) for i in ids] == [10] * 6
    rows = [r for i in ids for r in rows_of(parts[i])]
    assert sorted(rows) == list(range(1, 61))  # every record once
    for i in ids:
        df = parts[i]
        assert rows_of(df) == sorted(rows_of(df))  # the manifest's order within a part
        assert list(df["rid"]) == list(range(10))
        # the key comes from the row, wherever the record is planned
        assert list(df["key"]) == [make_key("web", "m", f"{r - 1:09d}") for r in rows_of(df)]
    parts_of = {}
    for i in ids:
        for u in parts[i]["url"]:
            parts_of.setdefault(url_host(u), set()).add(i)
    assert len(parts_of) == 20 and all(len(p) <= 2 for p in parts_of.values())
    assert sum(len(p) for p in parts_of.values()) <= 20 + len(ids) - 1  # only a run cut by a part's end splits
    _, again = plan(tmp_path / "again", src, part_size=10)
    assert all(again[i].equals(parts[i]) for i in ids)  # the same manifest, the same parts


def test_a_host_with_many_records_keeps_them_where_their_rows_fall(tmp_path):
    big = HOST_RECORDS_TOGETHER + 8
    urls = [f"http://big.example/{r}.jpg" if r % 2 == 0 else f"http://s{r}.example/{r}.jpg" for r in range(2 * big)]
    (tmp_path / "m.tsv").write_text("".join(f"c\t{u}\n" for u in urls))
    ids, parts = plan(tmp_path, manifest("web", tmp_path / "m.tsv", columns=["caption", "url"]), part_size=10)
    for n, i in enumerate(ids):
        big_rows = [r for r, u in zip(rows_of(parts[i]), parts[i]["url"]) if url_host(u) == "big.example"]
        assert big_rows == [r for r in range(n * 10 + 1, n * 10 + 11) if (r - 1) % 2 == 0]


def test_hosts_are_sorted_within_a_window_of_parts_only(tmp_path, monkeypatch):
    # a window of 2 parts of 10: the host's rows 1 and 21 are in different windows and stay apart; a file that
    # grows by appended rows plans anew only its last window
    monkeypatch.setattr(sources, "PLAN_WINDOW_RECORDS", 20)
    urls = [f"http://h{r % 7}.example/{r}.jpg" for r in range(30)]
    (tmp_path / "m.tsv").write_text("".join(f"c\t{u}\n" for u in urls))
    ids, parts = plan(tmp_path, manifest("web", tmp_path / "m.tsv", columns=["caption", "url"]), part_size=10)
    assert sorted(rows_of(parts[ids[0]]) + rows_of(parts[ids[1]])) == list(range(1, 21))
    assert rows_of(parts[ids[2]]) == list(range(21, 31))


def test_a_window_holds_whole_parts_up_to_80000_records():
    assert [sources.window_parts(n) for n in (5000, 10_000, 30_000, 80_000, 2_000_000)] == [16, 8, 2, 1, 1]


def test_url_host_is_the_lowercased_host_and_port():
    assert url_host("HTTPS://User:pw@Img.Example.com:8443/a/b.jpg?x=1") == "img.example.com:8443"
    assert url_host("s3://bucket/key.jpg") == "bucket"
    assert url_host("images/a.jpg") == "" and url_host("") == ""


def test_manifest_files_with_dotted_names_get_distinct_keys(tmp_path):
    for year in ("2023", "2024"):
        (tmp_path / f"cap.{year}.tsv").write_text("c\tx.jpg\n")
    ids, parts = plan(tmp_path, manifest("m", tmp_path / "cap.*.tsv", columns=["caption", "url"]))
    keys = [k for i in ids for k in parts[i]["key"]]
    assert len(set(keys)) == len(keys) == 2


def test_missing_url_column_is_a_config_error_listing_the_columns(tmp_path):
    path = tmp_path / "m.csv"
    pd.DataFrame({"link": ["a.jpg"], "caption": ["x"]}).to_csv(path, index=False)
    with pytest.raises(ConfigError) as e:
        plan(tmp_path, manifest("m", path))
    assert "'url'" in str(e.value) and "url_column" in str(e.value)
    assert "['link', 'caption']" in str(e.value)


def test_missing_default_url_column_is_a_config_error(tmp_path):
    (tmp_path / "m.tsv").write_text("x\thttp://a\n")
    src = {"name": "m", "type": "manifest", "path": str(tmp_path / "m.tsv"), "columns": ["caption", "link"]}
    with pytest.raises(ConfigError, match="url"):
        plan(tmp_path, src)


def test_missing_key_column_is_a_config_error(tmp_path):
    path = tmp_path / "m.parquet"
    pd.DataFrame({"url": ["a.jpg"]}).to_parquet(path)
    with pytest.raises(ConfigError, match="'uid'"):
        plan(tmp_path, manifest("m", path, key_column="uid"))


def test_a_headerless_file_with_more_fields_than_columns_names_is_refused_not_read_shifted(tmp_path):
    (tmp_path / "m.tsv").write_text("a cat\thttp://h/0.jpg\t0.1\n")
    src = manifest("m", tmp_path / "m.tsv", columns=["caption", "url"])
    with pytest.raises(ConfigError, match=r"m.tsv: its rows have 3 fields and 'columns' names 2"):
        plan(tmp_path, src)
    _, parts = plan(tmp_path, {**src, "columns": ["caption", "url", "punsafe"]})
    assert list(parts["m-000000"]["url"]) == ["http://h/0.jpg"]


def test_a_row_the_parser_cannot_split_is_a_one_line_error_naming_the_manifest(tmp_path):
    (tmp_path / "m.tsv").write_text("a cat\thttp://h/0.jpg\t0.1\na dog\twith a tab\thttp://h/1.jpg\t0.2\n")
    with pytest.raises(ConfigError) as e:
        plan(tmp_path, manifest("m", tmp_path / "m.tsv", columns=["caption", "url", "punsafe"]))
    message = str(e.value)
    assert "m.tsv cannot be read" in message and "line 2" in message and "tab" in message
    assert "\n" not in message.strip()


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_an_integer_id_column_with_an_empty_cell_keeps_its_ids_whole(tmp_path, fmt):
    rows = {"url": ["a.jpg", "b.jpg", "c.jpg"], "caption": ["x", "y", "z"], "SAMPLE_ID": [1000001, 1000002, None]}
    path = tmp_path / f"m.{fmt}"
    if fmt == "parquet":  # as Spark and pyarrow write it: no pandas metadata to restore an Int64 column from
        pq.write_table(pa.table({**rows, "SAMPLE_ID": pa.array(rows["SAMPLE_ID"], pa.int64())}), path)
    else:
        path.write_text("".join(json.dumps(dict(zip(rows, r))) + "\n" for r in zip(*rows.values())))
    _, parts = plan(tmp_path, manifest("m", path))
    assert [f["SAMPLE_ID"] for f in fields(parts["m-000000"])] == [1000001, 1000002, None]
    assert '"SAMPLE_ID": 1000001,' in parts["m-000000"]["fields"][0]  # not 1000001.0
    src = manifest("k", path, key_column="SAMPLE_ID")
    _, parts = plan(tmp_path, src)
    assert list(parts["k-000000"]["key"])[:2] == ["k-1000001", "k-1000002"]


def test_a_manifest_lacking_a_column_the_selection_reads_is_refused_and_carry_columns_keep_it(tmp_path):
    path = tmp_path / "m.parquet"
    pd.DataFrame({"url": ["a.jpg"], "caption": ["x"], "punsafe": [0.1]}).to_parquet(path)
    with pytest.raises(ConfigError, match=r"select reads manifest column 'pwatermark', which manifest .*m.parquet"):
        plan_parts([manifest("m", path)], 100, tmp_path / "parts", needed_columns=["pwatermark"])
    ids = plan_parts([manifest("m", path, carry_columns=["caption"])], 100, tmp_path / "p2", needed_columns=["punsafe"])
    assert fields(pd.read_parquet(tmp_path / "p2" / f"{ids[0]}.parquet")) == [{"caption": "x", "punsafe": 0.1}]


def test_a_jsonl_manifest_with_a_byte_order_mark_is_read(tmp_path):
    (tmp_path / "m.jsonl").write_bytes(b"\xef\xbb\xbf" + json.dumps({"url": "a.jpg", "caption": "x"}).encode() + b"\n")
    _, parts = plan(tmp_path, manifest("js", tmp_path / "m.jsonl"))
    assert list(parts["js-000000"]["url"]) == ["a.jpg"]


@pytest.mark.parametrize("fmt", ["csv", "jsonl", "parquet"])
def test_a_manifest_byte_that_is_no_utf8_is_read_as_latin1_not_lost_nor_refusing_the_file(tmp_path, fmt):
    """A stray cp1252 byte in one scraped row: a sidecar keeps its letter, so must a manifest."""
    caption = b"caf\xe9 au lait"
    path = tmp_path / f"m.{fmt}"
    if fmt == "csv":
        path.write_bytes(b"url,caption\na.jpg,ok\nb.jpg," + caption + b"\n")
    elif fmt == "jsonl":
        path.write_bytes(b'{"url": "a.jpg", "caption": "ok"}\n{"url": "b.jpg", "caption": "' + caption + b'"}\n')
    else:
        pd.DataFrame({"url": ["a.jpg", "b.jpg"], "caption": [b"ok", caption]}).to_parquet(path)
    _, parts = plan(tmp_path, manifest("m", path))
    assert [f["caption"] for f in fields(parts["m-000000"])] == ["ok", "café au lait"]


def test_infinite_manifest_cells_become_null_in_the_fields_as_nan_does(tmp_path):
    """JSON has no Infinity: the sample's json would be refused by strict readers."""
    path = tmp_path / "m.parquet"
    pd.DataFrame({"url": ["a.jpg"] * 3, "caption": ["x"] * 3, "s": [float("inf"), float("-inf"), 0.5]}).to_parquet(path)
    _, parts = plan(tmp_path, manifest("m", path))
    assert [f["s"] for f in fields(parts["m-000000"])] == [None, None, 0.5]
    assert "Infinity" not in "".join(parts["m-000000"]["fields"])


def test_an_empty_time_cell_becomes_null_in_the_fields_not_the_text_nat(tmp_path):
    path = tmp_path / "m.parquet"
    when = pd.to_datetime(["2024-01-01", None])
    pd.DataFrame({"url": ["a.jpg", "b.jpg"], "caption": ["x", "y"], "when": when}).to_parquet(path)
    _, parts = plan(tmp_path, manifest("m", path))
    assert [f["when"] for f in fields(parts["m-000000"])] == ["2024-01-01 00:00:00", None]


def test_a_jsonl_row_with_half_a_surrogate_pair_is_read_with_a_replacement_character(tmp_path):
    """An emoji cut in two by a length limit ("\\ud83d") in one row refused the whole file."""
    rows = ['{"url": "a.jpg", "caption": "ok \\ud83d\\ude00"}', '{"url": "b.jpg", "caption": "half \\ude00 a pair"}']
    (tmp_path / "m.jsonl").write_text("\n".join(rows) + "\n")
    _, parts = plan(tmp_path, manifest("m", tmp_path / "m.jsonl"))
    assert [f["caption"] for f in fields(parts["m-000000"])] == ["ok \U0001f600", "half \ufffd a pair"]


@pytest.mark.parametrize("case", ["cut_gzip", "not_parquet"])
def test_a_manifest_that_cannot_be_read_is_a_one_line_error_naming_it(tmp_path, case):
    if case == "cut_gzip":
        path = tmp_path / "m.tsv.gz"
        path.write_bytes(gzip.compress(b"http://a/1.jpg\tone\n" * 2000)[:60])
        src = manifest("m", path, columns=["url", "caption"])
    else:
        path = tmp_path / "m.bin"
        path.write_text("url,caption\n")
        src = manifest("m", path, format="parquet")
    with pytest.raises(ConfigError) as e:
        plan(tmp_path, src)
    assert str(e.value).startswith(f"manifest {path} cannot be read as ") and "\n" not in str(e.value)


def test_files_named_beyond_ascii_get_distinct_keys(tmp_path):
    for name in ("猫.jpg", "狗.jpg", "éa.jpg", "àa.jpg"):
        (tmp_path / "photos" / name).parent.mkdir(exist_ok=True)
        (tmp_path / "photos" / name).write_bytes(b"img")
    _, parts = plan(tmp_path, {"name": "p", "type": "folder", "path": str(tmp_path / "photos")})
    assert parts["p-000000"]["key"].nunique() == 4


def make_folder(root):
    for rel in ["b.jpg", "a.PNG", "sub/c.webp", "sub/deeper/d.jpeg", "photo.v2.jpg"]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"img")
    for rel in ["b.txt", "b.json", ".hidden.jpg", "notes.md", "sub/c.txt", "noext", "jpg"]:
        (root / rel).write_bytes(b"x")
    return root


def test_folder_source_lists_images_sorted_recursively_and_skips_other_files(tmp_path):
    root = make_folder(tmp_path / "imgs")
    _, parts = plan(tmp_path, {"name": "f", "type": "folder", "path": str(root)})
    df = parts["f-000000"]
    assert list(df["source_id"]) == ["a.PNG", "b.jpg", "photo.v2.jpg", "sub/c.webp", "sub/deeper/d.jpeg"]
    assert list(df["url"]) == [str(root / s) for s in df["source_id"]]
    assert list(df["key"]) == ["f-a", "f-b", "f-photo_v2", "f-sub_c", "f-sub_deeper_d"]
    assert all("." not in k for k in df["key"])


def test_folder_source_honours_image_extensions(tmp_path):
    root = make_folder(tmp_path / "imgs")
    _, parts = plan(tmp_path, {"name": "f", "type": "folder", "path": str(root), "image_extensions": [".WEBP"]})
    assert list(parts["f-000000"]["source_id"]) == ["sub/c.webp"]


def test_a_file_name_that_is_no_utf8_is_planned_with_a_url_that_opens_it(tmp_path):
    """A Latin-1 name (from an old zip) made plan_parts fail: no parquet file holds it as text."""
    root = tmp_path / "imgs"
    root.mkdir()
    name = os.fsencode(root) + b"/caf\xe9.jpg"
    with open(name, "wb") as f:
        f.write(b"img")
    _, parts = plan(tmp_path, {"name": "f", "type": "folder", "path": str(root)})
    [rec] = parts["f-000000"].to_dict("records")
    assert rec["source_id"] == "caf\\xe9.jpg" and rec["key"] == "f-caf_xe9"
    assert rec["url"] == f"file://{root}/caf%E9.jpg"
    with open_source(rec["url"]) as f:
        assert f.read() == b"img"


def test_folder_source_skips_hidden_folders(tmp_path):
    root = tmp_path / "imgs"
    (root / ".thumbnails").mkdir(parents=True)
    (root / ".thumbnails" / "a.jpg").write_bytes(b"thumb")
    (root / "a.jpg").write_bytes(b"img")
    _, parts = plan(tmp_path, {"name": "f", "type": "folder", "path": str(root)})
    assert list(parts["f-000000"]["source_id"]) == ["a.jpg"]


def test_shards_source_gives_one_part_per_expanded_path(tmp_path):
    pattern = str(tmp_path / "old-{000000..000002}.tar")
    ids, parts = plan(tmp_path, {"name": "old", "type": "shards", "path": pattern})
    assert ids == ["old-000000", "old-000001", "old-000002"]
    assert [list(parts[i]["url"]) for i in ids] == [[str(tmp_path / f"old-00000{n}.tar")] for n in range(3)]


@pytest.mark.parametrize("kind", ["folder", "manifest"])
def test_a_source_without_records_is_a_config_error(tmp_path, kind):
    (tmp_path / "empty").mkdir()
    (tmp_path / "m.csv").write_text("url,caption\n")
    src = {"name": "nothing", "type": kind, "path": str(tmp_path / ("empty" if kind == "folder" else "m.csv"))}
    with pytest.raises(ConfigError, match="nothing .* has no records"):
        plan(tmp_path, {"url_column": "url", **src} if kind == "manifest" else src)


def test_remote_manifests_are_read_through_the_projects_own_clients(tmp_path, http_server, s3_server, s3_bucket):
    from shardsmith.download.fetch.client import Fetcher
    from shardsmith.download.fetch.settings import FetchSettings
    from shardsmith.storage.s3 import run

    rows = pd.DataFrame({"url": ["http://x/a.jpg", "http://x/b.jpg"], "caption": ["a cat", "a dog"]})
    rows.to_parquet(tmp_path / "m.parquet", index=False)
    parquet_url = http_server.route("/data/m.parquet?sig=abc", Reply(body=(tmp_path / "m.parquet").read_bytes()))
    (tmp_path / "m.tsv.gz").write_bytes(gzip.compress(b"a bird\thttp://x/c.jpg\nthe sea\thttp://x/d.jpg\n"))
    run(s3_server, "s3", "cp", str(tmp_path / "m.tsv.gz"), f"s3://{s3_bucket}/cc3m/m.tsv.gz")
    fetcher = Fetcher(FetchSettings(**ALLOW_LOOPBACK), s3_server, log=lambda _: None)
    sources = [
        manifest("web", parquet_url),  # parquet over http, format told from the URL's path, query aside
        manifest("bucket", f"s3://{s3_bucket}/cc3m/m.tsv.gz", columns=["caption", "url"]),  # gzipped TSV on S3
    ]
    ids = plan_parts(sources, 100, tmp_path / "parts", fetcher)
    web, bucket = (pd.read_parquet(tmp_path / "parts" / f"{i}.parquet") for i in ids)
    assert (
        list(web["url"]) == ["http://x/a.jpg", "http://x/b.jpg"] and http_server.count("/data/m.parquet?sig=abc") == 1
    )
    assert [f["caption"] for f in fields(bucket)] == ["a bird", "the sea"]
    assert list(bucket["source_id"]) == [f"s3://{s3_bucket}/cc3m/m.tsv.gz:1", f"s3://{s3_bucket}/cc3m/m.tsv.gz:2"]
    assert not list(tmp_path.glob("**/shardsmith-manifest-*"))  # the copies are gone


def test_a_remote_manifest_that_cannot_be_read_is_a_one_line_config_error(tmp_path, http_server):
    from shardsmith.download.fetch.client import Fetcher
    from shardsmith.download.fetch.settings import FetchSettings

    fetcher = Fetcher(FetchSettings(retries=0, **ALLOW_LOOPBACK), log=lambda _: None)
    with pytest.raises(ConfigError, match=r"manifest http://127\.0\.0\.1:\d+/gone\.tsv cannot be read: not_found"):
        plan_parts([manifest("web", http_server.url("/gone.tsv"))], 100, tmp_path / "parts", fetcher)


def test_image_files_a_folder_source_leaves_out_by_extension_are_named_in_the_log(tmp_path, caplog):
    for name in ("a.jpg", "b.heic", "c.JFIF", "d.jfif", "notes.txt", "a.txt"):
        (tmp_path / name).write_bytes(b"x")
    src = {"name": "photos", "type": "folder", "path": str(tmp_path)}
    with caplog.at_level("WARNING"):
        parts = list(sources.iter_folder_parts(src, 10))
    assert [r["source_id"] for p in parts for r in p] == ["a.jpg"]
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "source photos: 3 image files left out" in warning and "(.heic 1, .jfif 2)" in warning
    caplog.clear()
    with caplog.at_level("WARNING"):
        list(sources.iter_folder_parts({**src, "image_extensions": ["jpg", "heic", "jfif"]}, 10))
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_a_jsonl_key_some_lines_lack_is_an_empty_cell_at_any_part_size(tmp_path):
    """A JSON line names its own keys: a part of lines without `punsafe` is not a manifest without the column."""
    rows = [{"url": f"{i}.jpg", "caption": "x"} for i in range(5)] + [{"url": "5.jpg", "caption": "y", "punsafe": 0.1}]
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    src = manifest("js", tmp_path / "m.jsonl")
    rule = {"name": "unsafe", "column": "punsafe", "op": "<", "value": 0.5}
    for size in (2, 100):
        ids = plan_parts([src], size, tmp_path / f"parts{size}", filters=[rule])
        df = pd.concat(pd.read_parquet(tmp_path / f"parts{size}" / f"{i}.parquet") for i in ids)
        assert sorted(df["filter"]) == [""] + ["unsafe"] * 5
        assert set(df.loc[df["filter"] == "unsafe", "filter_detail"]) == {"punsafe is empty; kept: punsafe < 0.5"}
    with pytest.raises(
        ConfigError,
        match=r"names column 'nsfw', which manifest .* lacks; its columns are \['url', 'caption', 'punsafe'\]",
    ):
        plan_parts([src], 2, tmp_path / "nsfw", filters=[{**rule, "name": "nsfw", "column": "nsfw"}])
