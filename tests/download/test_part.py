"""download_part (shardsmith.download.part): one status row per input record, and the raw tar holds exactly the
fetched ones; with remote inputs (HTTP manifests, S3 URLs: real servers on 127.0.0.1, tests/httpserver.py and
moto_server through the real aws CLI), reruns that fetch only what failed (the raw-cache keep) and the
retry-failed command. Source shards: test_source_shards.py; the keep itself: test_rawcache.py."""

import hashlib
import io
import json
import multiprocessing
import os
import signal
import tarfile
import time

import pandas as pd
import pytest
from generated import jpeg_bytes, tar_entry, write_tar
from httpserver import Reply
from servers import ALLOW_LOOPBACK

from shardsmith.__main__ import main as shardsmith_main
from shardsmith.core.leftovers import find_leftovers, remove_leftovers
from shardsmith.core.stopping import STOPPED_EXIT_CODE, Stopped, stop_on_sigterm
from shardsmith.download import commits
from shardsmith.download.part import download_part
from shardsmith.download.process.captions import CaptionSettings
from shardsmith.download.process.part import PartProcessor
from shardsmith.download.process.resize import ResizeSettings
from shardsmith.download.rawcache import Keep, mark_failed
from shardsmith.download.sources import plan_parts
from shardsmith.storage.s3 import upload


def run(tmp_path, source: dict) -> tuple[list[pd.DataFrame], list[dict[str, dict[str, bytes]]]]:
    """Plan and download every part of `source`; returns each part's status and raw members {key: {ext: bytes}}."""
    ids = plan_parts([source], 100, tmp_path / "parts")
    statuses, raws = [], []
    for pid in ids:
        records = tmp_path / "parts" / f"{pid}.parquet"
        tar, status_path = tmp_path / "raw" / f"{pid}.tar", tmp_path / "raw" / f"{pid}.status.parquet"
        status = download_part(str(records), str(tar), str(status_path), source)
        assert status.equals(pd.read_parquet(status_path))
        raw = read_raw(tar)
        assert_ledger(pd.read_parquet(records), status, raw, source)
        statuses.append(status)
        raws.append(raw)
    return statuses, raws


def read_raw(path) -> dict[str, dict[str, bytes]]:
    out: dict[str, dict[str, bytes]] = {}
    with tarfile.open(path) as tar:
        for m in tar:
            key, ext = m.name.split(".")
            out.setdefault(key, {})[ext] = tar.extractfile(m).read()
    return out


def assert_ledger(records: pd.DataFrame, status: pd.DataFrame, raw: dict, source: dict) -> None:
    assert list(status["rid"]) == list(range(len(status)))
    if source["type"] != "shards":  # a source shard expands into its groups
        assert list(status["source_id"]) == list(records["source_id"])
    assert set(status["status"]) <= {"ok", "error"}
    assert ((status["status"] == "ok") == (status["reason"] == "")).all()
    ok = status[status["status"] == "ok"]
    assert set(raw) == {f"r{rid:07d}" for rid in ok["rid"]}
    assert all(set(m) == {"img", "meta"} for m in raw.values())
    assert [len(raw[f"r{r:07d}"]["img"]) for r in ok["rid"]] == list(ok["bytes"])


def by_id(status: pd.DataFrame) -> dict[str, dict]:
    return {r["source_id"]: r for r in status.to_dict("records")}


def test_manifest_records_with_local_paths_and_file_urls_are_fetched(tmp_path):
    img1, img2 = jpeg_bytes(color=(1, 2, 3)), jpeg_bytes(color=(9, 9, 9))
    (tmp_path / "one.jpg").write_bytes(img1)
    (tmp_path / "my pic.jpg").write_bytes(img2)
    lines = [
        f"plain path\t{tmp_path / 'one.jpg'}",
        f"file url\tfile://{tmp_path / 'my%20pic.jpg'}",
        f"gone\t{tmp_path / 'missing.jpg'}",
        "no url\t",
        "remote\tftp://example.com/x.jpg",
        f"folder\t{tmp_path}",
    ]
    (tmp_path / "m.tsv").write_text("\n".join(lines) + "\n")
    src = {
        "name": "m",
        "type": "manifest",
        "path": str(tmp_path / "m.tsv"),
        "columns": ["caption", "url"],
        "url_column": "url",
    }
    [status], [raw] = run(tmp_path, src)
    assert list(status["status"]) == ["ok", "ok", "error", "error", "error", "error"]
    assert list(status["reason"]) == ["", "", "not_found", "no_url", "unsupported_url", "unreadable"]
    assert raw["r0000000"]["img"] == img1 and raw["r0000001"]["img"] == img2
    assert json.loads(raw["r0000000"]["meta"]) == {"caption": "plain path", "url": str(tmp_path / "one.jpg")}
    assert list(status["bytes"]) == [len(img1), len(img2), 0, 0, 0, 0]


def test_folder_source_picks_up_sidecar_txt_and_json(tmp_path):
    root = tmp_path / "photos"
    (root / "sub").mkdir(parents=True)
    (root / "a.jpg").write_bytes(jpeg_bytes())
    (root / "a.txt").write_text("a caption ✓")
    (root / "a.json").write_text('{"caption": "from json", "n": 2}')
    (root / "sub" / "b.png").write_bytes(b"png bytes")
    (root / "sub" / "b.json").write_text("not json{")
    [status], [raw] = run(tmp_path, {"name": "photos", "type": "folder", "path": str(root)})
    assert list(status["status"]) == ["ok", "ok"]
    assert list(status["key"]) == ["photos-a", "photos-sub_b"]
    assert json.loads(raw["r0000000"]["meta"]) == {"txt": "a caption ✓", "json": {"caption": "from json", "n": 2}}
    assert json.loads(raw["r0000001"]["meta"]) == {"json": "not json{"}  # invalid json kept as text
    assert raw["r0000001"]["img"] == b"png bytes"


def test_sidecar_text_is_decoded_by_its_byte_order_mark(tmp_path):
    # Notepad's "Unicode" is UTF-16 with a BOM; "UTF-8" adds a BOM; an old editor's Latin-1 has neither
    root = tmp_path / "photos"
    root.mkdir()
    texts = {"a": "hello wörld".encode("utf-16"), "b": "\ufeffcafé crème".encode(), "c": "café".encode("latin-1")}
    for name, data in texts.items():
        (root / f"{name}.jpg").write_bytes(jpeg_bytes())
        (root / f"{name}.txt").write_bytes(data)
    [status], [raw] = run(tmp_path, {"name": "photos", "type": "folder", "path": str(root)})
    captions = [json.loads(raw[f"r{i:07d}"]["meta"])["txt"] for i in range(3)]
    assert captions == ["hello wörld", "café crème", "café"]


def test_upper_case_sidecars_are_read_as_upper_case_images_are(tmp_path):
    """X.JPG was an image, but its X.TXT was not its caption: the record went to the ledger as no_caption."""
    root = tmp_path / "photos"
    root.mkdir()
    (root / "X.JPG").write_bytes(jpeg_bytes())
    (root / "X.TXT").write_text("upper case caption")
    (root / "y.jpg").write_bytes(jpeg_bytes())
    (root / "y.JSON").write_text('{"caption": "upper case json"}')
    [status], [raw] = run(tmp_path, {"name": "photos", "type": "folder", "path": str(root)})
    assert json.loads(raw["r0000000"]["meta"]) == {"txt": "upper case caption"}
    assert json.loads(raw["r0000001"]["meta"]) == {"json": {"caption": "upper case json"}}


def run_json_sidecar(tmp_path, text: str):
    """A folder source of one image with `text` as its JSON sidecar, downloaded: (status, raw members)."""
    root = tmp_path / "photos"
    root.mkdir()
    (root / "a.jpg").write_bytes(jpeg_bytes())
    (root / "a.json").write_text(text)
    [status], [raw] = run(tmp_path, {"name": "photos", "type": "folder", "path": str(root)})
    return status, raw


def test_nan_and_infinity_in_a_json_sidecar_become_null(tmp_path):
    """Python's json writes and reads them, but they are no JSON: the published sample's json must be."""
    status, raw = run_json_sidecar(tmp_path, '{"caption": "a cat", "score": NaN, "range": [-Infinity, Infinity]}')
    meta = raw["r0000000"]["meta"].decode()
    assert json.loads(meta) == {"json": {"caption": "a cat", "score": None, "range": [None, None]}}
    assert "NaN" not in meta and "Infinity" not in meta


def test_a_json_sidecar_with_half_a_surrogate_pair_is_read_with_a_replacement_character(tmp_path):
    """JSON may escape a lone surrogate, which no UTF-8 file holds: it stopped the whole part."""
    status, raw = run_json_sidecar(tmp_path, '{"caption": "cut \\ud83d", "tags": ["\\udc00"]}')
    assert list(status["status"]) == ["ok"]
    assert json.loads(raw["r0000000"]["meta"]) == {"json": {"caption": "cut \ufffd", "tags": ["\ufffd"]}}


def test_a_sidecar_that_cannot_be_read_rejects_its_record_and_the_part_goes_on(tmp_path):
    """A folder named like a sidecar (or one without permission) stopped the whole part with a traceback."""
    root = tmp_path / "photos"
    root.mkdir()
    for name in ("a", "b", "c"):
        (root / f"{name}.jpg").write_bytes(jpeg_bytes())
        (root / f"{name}.txt").write_text(f"caption {name}")
    (root / "b.txt").unlink()
    (root / "b.txt").mkdir()
    [status], [raw] = run(tmp_path, {"name": "photos", "type": "folder", "path": str(root)})
    assert list(status["status"]) == ["ok", "error", "ok"]
    assert status["detail"][1] == f"sidecar: is a folder, not a file: {root / 'b.txt'}"
    assert sorted(raw) == ["r0000000", "r0000002"]


def test_a_named_pipe_as_image_or_sidecar_is_unreadable_and_never_blocks_the_part(tmp_path):
    """Opening a pipe with no writer waits forever, past any deadline and SIGTERM: it is never read."""
    root = tmp_path / "photos"
    root.mkdir()
    for name in ("a", "b"):
        (root / f"{name}.txt").write_text(f"caption {name}")
    (root / "a.jpg").write_bytes(jpeg_bytes())
    os.mkfifo(root / "b.jpg")  # an image that is a pipe
    (root / "c.jpg").write_bytes(jpeg_bytes())
    os.mkfifo(root / "c.txt")  # a sidecar that is a pipe
    source = {"name": "photos", "type": "folder", "path": str(root)}
    child = multiprocessing.get_context("fork").Process(target=run, args=(tmp_path, source))
    child.start()
    child.join(60)
    if child.is_alive():
        child.kill()
        child.join()
        pytest.fail("download_part blocked on a named pipe")
    assert child.exitcode == 0
    status = pd.read_parquet(tmp_path / "raw" / "photos-000000.status.parquet")
    assert list(status["reason"]) == ["", "unreadable", "unreadable"]
    assert status["detail"][1] == f"not a regular file (a named pipe, socket or device): {root / 'b.jpg'}"
    assert status["detail"][2] == f"sidecar: not a regular file (a named pipe, socket or device): {root / 'c.txt'}"
    assert sorted(read_raw(tmp_path / "raw" / "photos-000000.tar")) == ["r0000000"]


def shard_source(pattern) -> dict:
    return {"name": "old", "type": "shards", "path": str(pattern)}


def test_shards_source_groups_become_records_and_bad_groups_are_errors(tmp_path):
    img = jpeg_bytes()
    write_tar(
        tmp_path / "old-000000.tar",
        [
            tar_entry("good.jpg", img), tar_entry("good.txt", b"good caption"),
            tar_entry("sym.jpg", type=tarfile.SYMTYPE, linkname="/etc/passwd"), tar_entry("sym.txt", b"x"),
            tar_entry("textonly.txt", b"no picture"),
            tar_entry("img.0.jpg", img), tar_entry("img.0.json", b'{"description": "dotted"}'),
            tar_entry("img.1.PNG", b"png"),
            tar_entry("twice.jpg", img), tar_entry("twice.jpg", img), tar_entry("twice.txt", b"which one?"),
            tar_entry("LICENSE", b"cc-by"),
            tar_entry("both.jpg", type=tarfile.SYMTYPE, linkname="x"), tar_entry("both.txt", b"a"),
            tar_entry("both.txt", b"b"),
            tar_entry("0009.image.jpg", img), tar_entry("0009.caption.txt", b"named WebDataset's way"),
        ],
    )  # fmt: skip
    [status], [raw] = run(tmp_path, shard_source(tmp_path / "old-000000.tar"))
    rows = by_id(status)
    url = str(tmp_path / "old-000000.tar")
    keys = ("good", "sym", "textonly", "img.0", "img.1", "twice", "LICENSE", "both", "0009")
    assert list(rows) == [f"{url}#{k}" for k in keys]
    assert [r["reason"] for r in rows.values()] == [
        "", "unsafe_member", "no_image", "", "", "repeated_member", "member_without_extension", "unsafe_member", ""
    ]  # fmt: skip
    wds_named = f"r{rows[f'{url}#0009']['rid']:07d}"
    assert raw[wds_named]["img"] == img and json.loads(raw[wds_named]["meta"]) == {"txt": "named WebDataset's way"}
    assert "link: sym.jpg" in rows[f"{url}#sym"]["detail"]
    assert rows[f"{url}#twice"]["detail"] == "repeated member: twice.jpg"
    assert rows[f"{url}#both"]["detail"] == "link: both.jpg; repeated member: both.txt"
    assert rows[f"{url}#img.0"]["key"] == "old-old-000000-img_0"
    good, dotted, png = (f"r{rows[f'{url}#{k}']['rid']:07d}" for k in ("good", "img.0", "img.1"))
    assert raw[good]["img"] == img and json.loads(raw[good]["meta"]) == {"txt": "good caption"}
    assert json.loads(raw[dotted]["meta"]) == {"json": {"description": "dotted"}}
    assert raw[png]["img"] == b"png"


def test_missing_source_shard_is_a_not_found_row(tmp_path):
    write_tar(tmp_path / "old-000000.tar", [tar_entry("a.jpg", b"A")])
    statuses, _ = run(tmp_path, shard_source(tmp_path / "old-{000000..000001}.tar"))
    assert [list(s["reason"]) for s in statuses] == [[""], ["not_found"]]
    assert statuses[1]["source_id"][0] == str(tmp_path / "old-000001.tar")


def truncated_shard(tmp_path, cut_in: str) -> str:
    """A three-sample source shard cut inside the data of sample c's jpg, or inside the header of b's txt."""
    path = write_tar(
        tmp_path / "full.tar",
        [e for k in "abc" for e in (tar_entry(f"{k}.jpg", jpeg_bytes() + b"\0" * 2000), tar_entry(f"{k}.txt", b"cap"))],
    )
    with tarfile.open(path) as tar:
        members = {m.name: m for m in tar}
    cut = members["c.jpg"].offset_data + 1000 if cut_in == "data" else members["b.txt"].offset + 100
    (tmp_path / "old-000000.tar").write_bytes(path.read_bytes()[:cut])
    path.unlink()
    return str(tmp_path / "old-000000.tar")


def test_truncated_source_shard_gives_the_readable_records_and_one_broken_shard_row(tmp_path):
    url = truncated_shard(tmp_path, "data")
    [status], [raw] = run(tmp_path, shard_source(url))
    assert list(status["source_id"]) == [f"{url}#a", f"{url}#b", f"{url}#<rest>"]
    assert list(status["reason"]) == ["", "", "broken_shard"]
    assert len(raw) == 2


def test_source_shard_cut_inside_a_header_is_reported_broken(tmp_path):
    url = truncated_shard(tmp_path, "header")
    [status], _ = run(tmp_path, shard_source(url))
    assert list(status["reason"]) == ["", "broken_shard"]


def test_same_named_source_shards_in_different_folders_give_distinct_keys(tmp_path):
    for year in ("2023", "2024"):
        (tmp_path / year).mkdir()
        write_tar(tmp_path / year / "000000.tar", [tar_entry("000000000.jpg", b"A")])
    statuses, _ = run(tmp_path, shard_source(tmp_path / "{2023,2024}" / "000000.tar"))
    keys = [k for s in statuses for k in s["key"]]
    assert len(set(keys)) == 2


def test_local_reads_stay_inside_the_sources_folders(tmp_path):
    """A manifest's local paths are read below its own folder (or download.allow_local_folders); a folder
    source's links out of the folder, image or sidecar, and a shard linked in from elsewhere are refused."""
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "photo.jpg").write_bytes(jpeg_bytes(color=(5, 5, 5)))
    (secret / "notes.txt").write_text("private notes")
    write_tar(secret / "other.tar", [tar_entry("s.jpg", jpeg_bytes()), tar_entry("s.txt", b"an archived photo")])

    data = tmp_path / "data"
    (data / "img").mkdir(parents=True)
    (data / "img" / "in.jpg").write_bytes(jpeg_bytes())
    rows = [str(data / "img" / "in.jpg"), str(secret / "photo.jpg"), f"{data}/../secret/photo.jpg"]
    (data / "m.tsv").write_text("".join(f"caption {i}\t{u}\n" for i, u in enumerate(rows)))
    src = {"name": "m", "type": "manifest", "path": str(data / "m.tsv"), "columns": ["caption", "url"]}
    [status], _ = run(tmp_path / "manifest", src)
    assert list(status["reason"]) == ["", "outside_allowed_folders", "outside_allowed_folders"]

    plan_parts([src], 100, tmp_path / "again" / "parts")
    part = str(tmp_path / "again" / "parts" / "m-000000.parquet")
    status = download_part(part, str(tmp_path / "again" / "r.tar"), str(tmp_path / "again" / "r.status.parquet"), src,
                           {"allow_local_folders": [str(secret)]}, log=lambda _: None)  # fmt: skip
    assert list(status["status"]) == ["ok"] * 3

    photos = tmp_path / "photos"
    photos.mkdir()
    (photos / "a.jpg").write_bytes(jpeg_bytes())
    (photos / "b.jpg").write_bytes(jpeg_bytes())
    (photos / "b.txt").symlink_to(secret / "notes.txt")  # a sidecar linked out
    (photos / "c.jpg").symlink_to(secret / "photo.jpg")  # an image linked out
    [status], [raw] = run(tmp_path / "folder", {"name": "p", "type": "folder", "path": str(photos)})
    assert list(status["reason"]) == ["", "outside_allowed_folders", "outside_allowed_folders"]
    assert "notes.txt" in status["detail"][1] and "photo.jpg" in status["detail"][2]
    assert b"private notes" not in b"".join(m["meta"] for m in raw.values())

    (tmp_path / "shards").mkdir()
    write_tar(tmp_path / "shards" / "x-0.tar", [tar_entry("k.jpg", jpeg_bytes()), tar_entry("k.txt", b"a photo")])
    (tmp_path / "shards" / "x-1.tar").symlink_to(secret / "other.tar")
    statuses, _ = run(tmp_path / "shards-run", shard_source(tmp_path / "shards" / "x-{0..1}.tar"))
    assert [list(s["reason"]) for s in statuses] == [[""], ["outside_allowed_folders"]]


# --- remote inputs --------------------------------------------------------------------------------

RESIZE = ResizeSettings(max_side=64, min_side=8)
FAST = dict(
    concurrency=4, per_host_concurrency=4, connect_timeout_s=2, read_timeout_s=1, request_timeout_s=2,
    retries=2, backoff_s=0.05, backoff_max_s=0.2, part_deadline_s=60, **ALLOW_LOOPBACK,
)  # fmt: skip


def run_remote(tmp_path, source: dict, s3=None, part_size: int = 100, **settings):
    """Plan `source` (again) and download every part; returns [(status, raw members)] per part."""
    ids = plan_parts([source], part_size, tmp_path / "parts")
    out = []
    for pid in ids:
        records = tmp_path / "parts" / f"{pid}.parquet"
        tar, status_path = tmp_path / "raw" / f"{pid}.tar", tmp_path / "raw" / f"{pid}.status.parquet"
        status = download_part(
            str(records), str(tar), str(status_path), source, {**FAST, **settings}, s3, log=lambda m: None
        )
        assert status.equals(pd.read_parquet(status_path))
        raw = read_raw(tar)
        assert_ledger(pd.read_parquet(records), status, raw, source)
        out.append((status, raw))
    return out


def snakemake_deletes_outputs(tmp_path) -> None:
    """What Snakemake does before it reruns a job: remove its declared outputs."""
    for p in (tmp_path / "raw").glob("*.*"):
        if p.is_dir():
            continue
        p.unlink()


def write_manifest(path, rows: list[dict]) -> None:
    pd.DataFrame(rows).to_parquet(path, index=False)


def manifest_source(path, **extra) -> dict:
    return {"name": "web", "type": "manifest", "path": str(path), "url_column": "url", **extra}


def reasons(status: pd.DataFrame) -> list[str]:
    return [r or "ok" for r in status["reason"]]


def test_http_manifest_rows_carry_reason_status_attempts_and_hash_check(tmp_path, http_server):
    s = http_server
    imgs = [jpeg_bytes(color=(i * 40, 10, 10)) for i in range(4)]
    md5 = [hashlib.md5(b).hexdigest() for b in imgs]
    rows = [
        {"url": s.route("/a.jpg", Reply(body=imgs[0])), "caption": "a", "md5": md5[0]},
        {"url": s.route("/b.jpg", Reply(body=imgs[1])), "caption": "b", "md5": md5[0]},  # bytes changed since
        {"url": s.route("/c.jpg", Reply(body=imgs[2])), "caption": "c", "md5": ""},  # no hash: not checked
        {"url": s.route("/d.jpg", Reply(500, b""), Reply(body=imgs[3])), "caption": "d", "md5": md5[3]},
        {"url": s.url("/gone.jpg"), "caption": "e", "md5": ""},
        {"url": s.route("/f.jpg", Reply(body=b"<html>moved</html>")), "caption": "f", "md5": ""},
    ]
    write_manifest(tmp_path / "m.parquet", rows)
    [(status, raw)] = run_remote(tmp_path, manifest_source(tmp_path / "m.parquet", hash_column="md5"))
    assert reasons(status) == ["ok", "hash_mismatch", "ok", "ok", "not_found", "not_an_image"]
    assert list(status["http_status"]) == [200, 200, 200, 200, 404, 200]
    assert list(status["attempts"]) == [1, 1, 1, 2, 1, 1]
    assert [raw[f"r{i:07d}"]["img"] for i in (0, 2, 3)] == [imgs[0], imgs[2], imgs[3]]
    assert json.loads(raw["r0000003"]["meta"]) == {"caption": "d", "md5": md5[3], "url": rows[3]["url"]}
    with tarfile.open(tmp_path / "raw" / "web-000000.tar") as tar:  # written as they arrived: only ok records
        assert sorted(m.name for m in tar) == [f"r{i:07d}.{e}" for i in (0, 2, 3) for e in ("img", "meta")]


def test_a_url_on_several_rows_of_a_part_is_requested_once_and_every_row_gets_its_outcome(tmp_path, http_server):
    """docs/crawler.md tells site owners each listed image is fetched once; LAION-style manifests repeat URLs."""
    s = http_server
    img = jpeg_bytes()
    dup, gone = s.route("/dup.jpg", Reply(body=img)), s.url("/gone.jpg")
    rows = [{"url": u, "caption": f"c{i}"} for i, u in enumerate([dup, gone, dup, gone, dup])]
    write_manifest(tmp_path / "m.parquet", rows)
    [(status, raw)] = run_remote(tmp_path, manifest_source(tmp_path / "m.parquet"))
    assert reasons(status) == ["ok", "not_found", "ok", "not_found", "ok"]
    assert list(status["http_status"]) == [200, 404, 200, 404, 200]
    assert (s.count("/dup.jpg"), s.count("/gone.jpg")) == (1, 1)
    assert [raw[f"r{i:07d}"]["img"] for i in (0, 2, 4)] == [img] * 3
    assert [json.loads(raw[f"r{i:07d}"]["meta"])["caption"] for i in (0, 2, 4)] == ["c0", "c2", "c4"]


def test_rerun_fetches_only_retryable_failures_and_keeps_the_rest(tmp_path, http_server):
    s = http_server
    imgs = [jpeg_bytes(color=(i * 40, 90, 10)) for i in range(3)]
    urls = [
        s.route("/ok0.jpg", Reply(body=imgs[0])),
        s.route("/flaky.jpg", Reply(500, b"")),  # down for the whole first run
        s.route("/ok2.jpg", Reply(body=imgs[2])),
        s.url("/gone.jpg"),  # 404: final, never refetched
        s.route("/slow.jpg", Reply(body=imgs[1], stall=30)),  # times out in the first run
    ]
    write_manifest(tmp_path / "m.parquet", [{"url": u, "caption": f"c{i}"} for i, u in enumerate(urls)])
    src = manifest_source(tmp_path / "m.parquet")
    [(first, _)] = run_remote(tmp_path, src, read_timeout_s=0.3, retries=1)
    assert reasons(first) == ["ok", "server_error", "ok", "not_found", "timeout"]
    counts = {p: s.count(p) for p in ("/ok0.jpg", "/flaky.jpg", "/ok2.jpg", "/gone.jpg", "/slow.jpg")}
    assert counts == {"/ok0.jpg": 1, "/flaky.jpg": 2, "/ok2.jpg": 1, "/gone.jpg": 1, "/slow.jpg": 2}

    s.route("/flaky.jpg", Reply(body=imgs[1]))  # the server is back
    s.route("/slow.jpg", Reply(body=imgs[1]))
    snakemake_deletes_outputs(tmp_path)
    [(second, raw)] = run_remote(tmp_path, src)
    assert reasons(second) == ["ok", "ok", "ok", "not_found", "ok"]
    assert list(second["attempts"]) == [1, 1, 1, 1, 1]
    after = {p: s.count(p) for p in counts}
    assert after == {**counts, "/flaky.jpg": 3, "/slow.jpg": 3}  # only the two failures were fetched again
    assert [raw[f"r{i:07d}"]["img"] for i in (0, 1, 2, 4)] == [imgs[0], imgs[1], imgs[2], imgs[1]]
    with tarfile.open(tmp_path / "raw" / "web-000000.tar") as tar:  # kept records first, then fetched ones
        names = [m.name for m in tar]
    assert names[:4] == [f"r{i:07d}.{e}" for i in (0, 2) for e in ("img", "meta")]
    assert sorted(names[4:]) == [f"r{i:07d}.{e}" for i in (1, 4) for e in ("img", "meta")]

    # nothing left to retry: a third run fetches nothing at all
    snakemake_deletes_outputs(tmp_path)
    [(third, _)] = run_remote(tmp_path, src)
    assert third.equals(second) and {p: s.count(p) for p in counts} == after


def test_kept_records_are_published_only_while_the_guard_allows_them(tmp_path, http_server):
    """Bytes kept in the raw cache from a run that allowed a network are not reused once it is no longer
    allowed: a rerun refuses them (nothing fetched) and the raw tar no longer holds them."""
    s = http_server
    img = jpeg_bytes()
    write_manifest(tmp_path / "m.parquet", [{"url": s.route("/a.jpg", Reply(body=img)), "caption": "a"}])
    src = manifest_source(tmp_path / "m.parquet")
    [(first, _)] = run_remote(tmp_path, src)
    assert reasons(first) == ["ok"] and s.count("/a.jpg") == 1

    snakemake_deletes_outputs(tmp_path)
    [(second, raw)] = run_remote(tmp_path, src, allow_networks=[])
    assert reasons(second) == ["blocked_address"] and "127.0.0.1 (loopback)" in second["detail"][0]
    assert raw == {} and s.count("/a.jpg") == 1


def test_a_changed_record_is_fetched_again_and_captions_follow_the_manifest(tmp_path, http_server):
    s = http_server
    a, b, c = (jpeg_bytes(color=(1, i * 60, 1)) for i in range(3))
    urls = [s.route("/a.jpg", Reply(body=a)), s.route("/b.jpg", Reply(body=b)), s.route("/c.jpg", Reply(body=c))]
    write_manifest(tmp_path / "m.parquet", [{"url": urls[0], "caption": "one"}, {"url": urls[1], "caption": "two"}])
    run_remote(tmp_path, manifest_source(tmp_path / "m.parquet"))
    # the manifest changes: a caption is fixed, the second record now points elsewhere
    write_manifest(tmp_path / "m.parquet", [{"url": urls[0], "caption": "ONE"}, {"url": urls[2], "caption": "two"}])
    snakemake_deletes_outputs(tmp_path)
    [(status, raw)] = run_remote(tmp_path, manifest_source(tmp_path / "m.parquet"))
    assert (s.count("/a.jpg"), s.count("/b.jpg"), s.count("/c.jpg")) == (1, 1, 1)
    assert raw["r0000001"]["img"] == c
    assert json.loads(raw["r0000000"]["meta"])["caption"] == "ONE"  # fields come from the records, not the cache


def test_retry_failed_marks_only_parts_with_retryable_failures(tmp_path, http_server):
    s = http_server
    img = jpeg_bytes()
    rows = [{"url": s.route("/ok.jpg", Reply(body=img)), "caption": "a"}, {"url": s.url("/gone.jpg"), "caption": "b"}]
    rows += [
        {"url": s.route("/down.jpg", Reply(502, b"")), "caption": "c"},
        {"url": s.route("/ok2.jpg", Reply(body=img)), "caption": "d"},
    ]
    write_manifest(tmp_path / "m.parquet", rows)
    # parts: [ok, gone], [down, ok2]
    run_remote(tmp_path, manifest_source(tmp_path / "m.parquet"), part_size=2, retries=0)
    keep = tmp_path / "raw" / ".keep"
    assert mark_failed(tmp_path / "raw", {"server_error"}, dry_run=True) == {"web-000001": {"server_error": 1}}
    assert not list(keep.glob("*.retry"))
    (tmp_path / "config.yaml").write_text(json.dumps({"dataset": "raw", "paths": {"raw": str(tmp_path)}}))
    assert shardsmith_main(["retry-failed", str(tmp_path / "config.yaml")]) == 0
    assert [p.name for p in keep.glob("*.retry")] == ["web-000001.retry"]
    assert shardsmith_main(["retry-failed", str(tmp_path / "config.yaml"), "--reasons", "not_found"]) == 0
    assert sorted(p.name for p in keep.glob("*.retry")) == ["web-000000.retry", "web-000001.retry"]


def test_retry_failed_takes_reasons_as_the_ledger_writes_them_and_names_those_no_record_has(
    tmp_path, http_server, capsys
):
    """The ledger and the summary say `download/not_found`: copied into --reasons, it must not match nothing
    silently, and a reason no failed record has is said to be so."""
    s = http_server
    write_manifest(tmp_path / "m.parquet", [{"url": s.url("/gone.jpg"), "caption": "b"}])
    run_remote(tmp_path, manifest_source(tmp_path / "m.parquet"), retries=0)
    (tmp_path / "config.yaml").write_text(json.dumps({"dataset": "raw", "paths": {"raw": str(tmp_path)}}))
    config = str(tmp_path / "config.yaml")
    assert shardsmith_main(["retry-failed", config, "--dry-run", "--reasons", "download/not_found", "notfound"]) == 0
    out = capsys.readouterr().out
    assert "web-000000: 1 records to refetch (not_found 1)" in out
    assert "no failed record has the reason notfound" in out


def test_retry_failed_with_a_config_it_cannot_use_says_so_in_one_line(tmp_path, capsys):
    (tmp_path / "empty.yaml").write_text("")  # what `new-config ... > my.yaml` leaves when new-config fails
    (tmp_path / "other.yaml").write_text("a: 1\n")
    (tmp_path / "broken.json").write_text('{"dataset": "x"\n')  # a config cut short
    cases = [("missing.yaml", "cannot read"), ("empty.yaml", "is no workflow config"), ("other.yaml", "is no")]
    cases.append(("broken.json", "but got '<stream end>' at line 2, column 1"))
    for name, said in cases:
        assert shardsmith_main(["retry-failed", str(tmp_path / name)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("shardsmith: retry-failed: ") and said in err and "\n" not in err


# --- S3 ----------------------------------------------------------------------------------------------


def test_s3_urls_in_a_manifest_are_fetched_with_the_aws_cli(tmp_path, s3_server, s3_bucket):
    img = jpeg_bytes()
    (tmp_path / "a.jpg").write_bytes(img)
    (tmp_path / "page.jpg").write_bytes(b"<!doctype html><html></html>")
    upload(str(tmp_path / "a.jpg"), f"s3://{s3_bucket}/img/a.jpg", s3_server)
    upload(str(tmp_path / "page.jpg"), f"s3://{s3_bucket}/img/page.jpg", s3_server)
    rows = [{"url": f"s3://{s3_bucket}/img/{n}", "caption": n} for n in ("a.jpg", "missing.jpg", "page.jpg")]
    rows.append({"url": "s3://no-such-bucket-here/x.jpg", "caption": "x"})
    rows += [{"url": u, "caption": u} for u in ("s3:///img/a.jpg", f"s3://{s3_bucket}/img/", f"s3://{s3_bucket}")]
    write_manifest(tmp_path / "m.parquet", rows)
    # each object is one `aws s3 cp` (a CLI start-up of about a second): allow for it on a busy machine
    [(status, raw)] = run_remote(tmp_path, manifest_source(tmp_path / "m.parquet"), s3=s3_server, request_timeout_s=60)
    assert reasons(status)[:3] == ["ok", "not_found", "not_an_image"]
    assert reasons(status)[3] in ("no_such_bucket", "not_found")
    assert reasons(status)[4:] == ["bad_url"] * 3
    assert list(status["detail"])[4:] == [
        "no bucket in s3:///img/a.jpg",
        f"no object key in s3://{s3_bucket}/img/ (a prefix, not an object)",
        f"no object key in s3://{s3_bucket} (a prefix, not an object)",
    ]
    assert list(status["attempts"]) == [1] * 7
    assert raw["r0000000"]["img"] == img


def shard_tar(samples: dict[str, dict[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for key, members in samples.items():
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _download_in_child(records: str, tar: str, status: str, source: dict, settings: dict, every: int) -> None:
    from shardsmith.download import rawcache

    rawcache.COMMIT_RECORDS = every
    download_part(records, tar, status, source, settings, log=lambda m: None)


def _one_part(tmp_path, urls: list[str]):
    """A manifest of `urls` planned as one part: (part id, its records, the source, raw tar, status path)."""
    write_manifest(tmp_path / "m.parquet", [{"url": u, "caption": f"c{i}"} for i, u in enumerate(urls)])
    src = manifest_source(tmp_path / "m.parquet")
    [pid] = plan_parts([src], 1000, tmp_path / "parts")
    raw_dir = tmp_path / "raw"
    return pid, tmp_path / "parts" / f"{pid}.parquet", src, raw_dir / f"{pid}.tar", raw_dir / f"{pid}.status.parquet"


def _stop_halfway(server, n: int, target, args: tuple, how: int) -> int:
    """Run `target(*args)` in a child process, send it `how` once the server has had n/2 requests; its exit code."""
    child = multiprocessing.get_context("fork").Process(target=target, args=args)
    child.start()
    deadline = time.monotonic() + 60
    while server.total() < n // 2 and time.monotonic() < deadline and child.is_alive():
        time.sleep(0.005)
    os.kill(child.pid, how)
    child.join(30)
    return child.exitcode


def test_a_part_killed_mid_download_resumes_from_its_last_commit(tmp_path, http_server):
    """SIGKILL while a part downloads: the rerun fetches no record of the last commit again, at most the
    records in flight and one commit interval of those fetched before the kill, and ends with the status
    and raw tar of a run never killed; nothing of the stopped run is left in .keep."""
    killed_part_resumes(tmp_path, http_server)


def test_a_part_killed_mid_download_over_https_resumes_from_its_last_commit(tmp_path, https_server):
    killed_part_resumes(tmp_path, https_server)


def killed_part_resumes(tmp_path, s) -> None:
    n, every = 240, 20
    imgs = [jpeg_bytes(color=(i % 250, i // 250, 7)) for i in range(n)]
    urls = [s.route(f"/{i}.jpg", Reply(body=imgs[i], delay=0.01)) for i in range(n)]
    urls[7] = s.url("/gone.jpg")  # a final failure: committed with its reason, not asked again
    pid, records, src, tar, status_path = _one_part(tmp_path, urls)
    raw_dir, settings = tar.parent, {**FAST, "concurrency": 4, "max_concurrency": 4, "per_host_concurrency": 4}
    _stop_halfway(s, n, _download_in_child, (str(records), str(tar), str(status_path), src, settings, every),
                  signal.SIGKILL)  # fmt: skip
    assert not tar.exists() and not status_path.exists()  # nothing at a final path
    committed = Keep(tar).load()
    assert committed is not None and len(committed) >= every
    before = {u: s.count(u.split(str(s.port))[1]) for u in urls}
    fetched_before = {u for u, c in before.items() if c}

    status = download_part(str(records), str(tar), str(status_path), src, settings, log=lambda m: None)
    again = {u for u in urls if s.count(u.split(str(s.port))[1]) > before[u]}
    assert not again & set(committed["url"])  # no committed record asked for again
    assert len(again & fetched_before) <= settings["concurrency"] + every
    assert reasons(status) == ["not_found" if i == 7 else "ok" for i in range(n)]
    raw = read_raw(tar)
    assert {k: v["img"] for k, v in raw.items()} == {f"r{i:07d}": imgs[i] for i in range(n) if i != 7}
    assert_ledger(pd.read_parquet(records), status, raw, src)
    assert sorted(p.name for p in (raw_dir / ".keep").iterdir()) == [f"{pid}.json", f"{pid}.status.parquet",
                                                                    f"{pid}.tar"]  # fmt: skip


def _stoppable_download(
    records: str, tar: str, status: str, source: dict, settings: dict, every: int, processed: str | None = None
) -> None:
    """download_part as the rule script runs it: SIGTERM stops it cleanly (exit code 143), its resize
    processor (with `processed`) committing what it has too."""
    from shardsmith.download import rawcache

    rawcache.COMMIT_RECORDS = every
    try:
        with stop_on_sigterm():
            if processed is None:
                download_part(records, tar, status, source, settings, log=lambda m: None)
                return
            with PartProcessor(processed, RESIZE, CaptionSettings()) as proc:
                download_part(records, tar, status, source, settings, log=lambda m: None, processor=proc)
    except Stopped:
        os._exit(STOPPED_EXIT_CODE)


def test_a_part_stopped_by_sigterm_commits_every_record_done(tmp_path, http_server):
    """SIGTERM (SLURM's time limit, preemption, scancel): the job commits every record it has, with no
    commit interval due, and exits 143; the rerun asks again only for what was in flight."""
    s = http_server
    n = 120
    imgs = [jpeg_bytes(color=(i % 250, 3, 7)) for i in range(n)]
    urls = [s.route(f"/{i}.jpg", Reply(body=imgs[i], delay=0.01)) for i in range(n)]
    pid, records, src, tar, status_path = _one_part(tmp_path, urls)
    raw_dir, settings = tar.parent, {**FAST, "concurrency": 4, "max_concurrency": 4, "per_host_concurrency": 4}
    args = (str(records), str(tar), str(status_path), src, settings, 100_000)  # no commit falls due
    assert _stop_halfway(s, n, _stoppable_download, args, signal.SIGTERM) == STOPPED_EXIT_CODE
    assert not tar.exists() and not status_path.exists()
    committed = Keep(tar).load()
    before = {u: s.count(u.split(str(s.port))[1]) for u in urls}
    assert committed is not None and len(committed) >= sum(map(bool, before.values())) - settings["concurrency"]

    lines = []
    status = download_part(str(records), str(tar), str(status_path), src, settings, log=lines.append)
    again = {u for u in urls if s.count(u.split(str(s.port))[1]) > before[u]}
    assert not again & set(committed["url"])
    assert len(again & {u for u, c in before.items() if c}) <= settings["concurrency"]
    # the part's progress counts from the committed state
    assert f"download {pid}: {len(committed)} records kept from a stopped run's commit, {len(again)} to fetch" in lines
    assert any(f"{n}/{n} records done ({len(committed)} kept, {len(again)} ok, 0 failed)" in line for line in lines)
    assert reasons(status) == ["ok"] * n
    assert {k: v["img"] for k, v in read_raw(tar).items()} == {f"r{i:07d}": imgs[i] for i in range(n)}
    assert sorted(p.name for p in (raw_dir / ".keep").iterdir()) == [f"{pid}.json", f"{pid}.status.parquet",
                                                                    f"{pid}.tar"]  # fmt: skip


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
def test_a_source_shard_part_stopped_midway_takes_its_committed_samples_over(tmp_path, http_server, monkeypatch, how):
    """A source shard streamed over HTTP (a part is one shard), the job stopped midway: the rerun reads the
    shard again (one request: a stream cannot be picked up in the middle) but takes the committed records
    from the commit, resizes none of the committed samples again, and ends with the status, raw tar and
    samples of a run never stopped."""
    from shardsmith.download.process import part as part_module

    s = http_server
    n = 150
    samples = {f"s-{j:03d}": {"jpg": jpeg_bytes(size=(96, 80), color=(j, 5, 1)), "txt": f"sample {j}".encode()}
               for j in range(n)}  # fmt: skip
    samples["s-bad"] = {"txt": b"no image"}
    s.route("/shards/web-0.tar", Reply(body=shard_tar(samples), chunk=4096, trickle=0.02))  # about 2 s a read
    src = {"name": "web", "type": "shards", "path": s.url("/shards/web-{0..0}.tar")}
    [pid] = plan_parts([src], 100, tmp_path / "parts")
    records = str(tmp_path / "parts" / f"{pid}.parquet")
    out = {}
    for name in ("clean", "stopped"):
        (tmp_path / name / "raw").mkdir(parents=True)
        (tmp_path / name / "processed").mkdir()
        out[name] = (tmp_path / name / "raw" / f"{pid}.tar", tmp_path / name / "processed" / f"{pid}.tar")

    def finish(raw_tar, processed):
        with PartProcessor(str(processed), RESIZE, CaptionSettings()) as proc:
            status = download_part(records, str(raw_tar), str(raw_tar).replace(".tar", ".status.parquet"), src, FAST,
                                   log=lambda m: None, processor=proc)  # fmt: skip
            proc.finish(status, str(processed).replace(".tar", ".samples.parquet"),
                        str(processed).replace(".tar", ".rejected.parquet"))  # fmt: skip
        return status

    expected = finish(*out["clean"])
    s.reset_counts()

    tar, processed = out["stopped"]
    every = 100_000 if how == signal.SIGTERM else 10
    args = (records, str(tar), str(tar).replace(".tar", ".status.parquet"), src, FAST, every, str(processed))
    child = multiprocessing.get_context("fork").Process(target=_stoppable_download, args=args)
    child.start()
    keep = tar.parent / ".keep"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and child.is_alive():
        got = commits.load(keep, pid)
        if (got is not None and len(got.rows) >= n // 3) or (how == signal.SIGTERM and s.total() and
                                                              time.monotonic() > deadline - 59.6):  # fmt: skip
            break
        time.sleep(0.01)
    os.kill(child.pid, how)
    child.join(30)
    assert child.exitcode == (STOPPED_EXIT_CODE if how == signal.SIGTERM else -signal.SIGKILL)
    committed = commits.load(keep, pid)
    done = commits.load(processed.parent / ".keep", pid)
    assert committed is not None and 0 < len(committed.rows) < n and done is not None
    remove_leftovers([tmp_path / "stopped"])

    resized = []
    real = part_module.process_image
    monkeypatch.setattr(part_module, "process_image", lambda data, r, *rest: resized.append(1) or real(data, r, *rest))
    status = finish(tar, processed)
    assert s.count("/shards/web-0.tar") == 2  # the stopped run's request and the rerun's
    assert set(done.rows["rid"]) <= set(committed.rows["rid"])
    assert len(resized) == n - len(done.rows)
    pd.testing.assert_frame_equal(status, expected)
    assert read_raw(tar) == read_raw(out["clean"][0])
    assert_ledger(pd.read_parquet(records), status, read_raw(tar), src)
    assert _samples(processed) == _samples(out["clean"][1])
    assert sorted(p.name for p in keep.iterdir()) == [f"{pid}.json", f"{pid}.status.parquet", f"{pid}.tar"]
    assert not (processed.parent / ".keep").exists() and find_leftovers([tmp_path]) == []


def _samples(processed) -> dict[str, tuple]:
    """Each sample's members, read at the samples table's offsets, and its other columns."""
    table = pd.read_parquet(str(processed).replace(".tar", ".samples.parquet"))
    data = processed.read_bytes()
    out = {}
    for row in table.to_dict("records"):
        got = tuple(data[row[f"{e}_offset"] : row[f"{e}_offset"] + row[f"{e}_size"]] for e in ("jpg", "txt", "json"))
        out[row["key"]] = (got, {k: v for k, v in row.items() if not k.endswith(("_offset", "_size"))})
    return out
