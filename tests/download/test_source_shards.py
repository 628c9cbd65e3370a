"""Source shards over s3:// and https:// (shardsmith.download.source_shards), streamed from servers on 127.0.0.1."""

import io
import json
import tarfile

import pandas as pd
from generated import jpeg_bytes
from httpserver import Reply

from shardsmith.core.keys import make_key
from shardsmith.download.source_shards import iter_shard, shard_keys
from shardsmith.storage.s3 import upload
from tests.download.test_part import reasons, shard_source, shard_tar, snakemake_deletes_outputs
from tests.download.test_part import run as run_local
from tests.download.test_part import run_remote as run


def test_s3_source_shards_are_streamed_with_a_brace_pattern(tmp_path, s3_server, s3_bucket):
    img = jpeg_bytes()
    for i in range(2):
        data = shard_tar(
            {f"{i}{k}": {"jpg": img, "json": json.dumps({"description": f"photo {i}{k}"}).encode()} for k in "ab"}
        )
        (tmp_path / f"old-{i}.tar").write_bytes(data)
        upload(str(tmp_path / f"old-{i}.tar"), f"s3://{s3_bucket}/shards/old-00000{i}.tar", s3_server)
    src = {"name": "old", "type": "shards", "path": f"s3://{s3_bucket}/shards/old-{{000000..000002}}.tar"}
    parts = run(tmp_path, src, s3=s3_server)
    assert [reasons(st) for st, _ in parts] == [["ok", "ok"], ["ok", "ok"], ["not_found"]]
    status, raw = parts[0]
    assert list(status["source_id"]) == [f"s3://{s3_bucket}/shards/old-000000.tar#0{k}" for k in "ab"]
    assert list(status["key"]) == ["old-old-000000-0a", "old-old-000000-0b"]
    assert json.loads(raw["r0000001"]["meta"]) == {"json": {"description": "photo 0b"}}
    assert parts[2][0]["source_id"][0] == f"s3://{s3_bucket}/shards/old-000002.tar"


def test_http_source_shards_stream_and_a_cut_shard_is_reread_on_retry(tmp_path, http_server):
    s = http_server
    img = jpeg_bytes()
    whole = shard_tar({k: {"jpg": img + b"\0" * 3000, "txt": k.encode()} for k in ("a", "b", "c")})
    content_type_tar = [("Content-Type", "application/x-tar")]
    s.route("/shards/web-000000.tar", Reply(body=whole, headers=content_type_tar))
    cut = whole[: len(whole) // 2 + 700]
    s.route("/shards/web-000001.tar", Reply(body=cut, headers=content_type_tar, content_length=len(whole)))
    src = {"name": "web", "type": "shards", "path": s.url("/shards/web-{000000..000001}.tar")}
    parts = run(tmp_path, src, retries=1)
    assert reasons(parts[0][0]) == ["ok", "ok", "ok"]
    cut_rows = parts[1][0]
    assert reasons(cut_rows)[-1] == "truncated_download" and cut_rows["source_id"].iloc[-1].endswith("#<rest>")
    assert set(reasons(cut_rows)[:-1]) == {"ok"} and len(cut_rows) < 4
    assert s.count("/shards/web-000000.tar") == 1 and s.count("/shards/web-000001.tar") == 1

    s.route("/shards/web-000001.tar", Reply(body=whole, headers=content_type_tar))
    snakemake_deletes_outputs(tmp_path)
    parts = run(tmp_path, src)
    assert [reasons(st) for st, _ in parts] == [["ok"] * 3, ["ok"] * 3]
    assert s.count("/shards/web-000000.tar") == 1  # kept: not read again
    assert s.count("/shards/web-000001.tar") == 2
    assert parts[0][1]["r0000002"]["img"] == img + b"\0" * 3000


def test_keys_recomputed_for_kept_rows_are_the_keys_first_given_when_a_path_or_name_holds_a_hash(tmp_path):
    """A rerun takes its kept rows' keys from shard_keys: a '#' in the folder or a member's name must not
    make them other keys than the first read gave (the published keys would change between versions)."""
    folder = tmp_path / "run#3"
    folder.mkdir()
    (folder / "old-000000.tar").write_bytes(shard_tar({k: {"jpg": jpeg_bytes(), "txt": b"cap"} for k in ("a", "b#2")}))
    src = {"name": "old", "type": "shards", "path": str(folder / "old-{000000..000001}.tar")}
    rows = [row for row, _, _ in iter_shard({"url": str(folder / "old-000000.tar"), "source": "old"}, src, None, 0)]
    status = pd.DataFrame(rows)
    assert list(status["key"]) == ["old-old-000000-a", make_key("old", "old-000000", "b#2")]
    assert shard_keys(status, src) == list(status["key"])


def test_a_member_name_that_is_no_utf8_becomes_a_record_with_its_name_escaped(tmp_path):
    """A member name in a legacy encoding (caf\\xe9.jpg) stopped the part: no parquet file holds it as text."""
    with tarfile.open(tmp_path / "old-000000.tar", "w", format=tarfile.USTAR_FORMAT, encoding="latin-1") as tar:
        for name, data in (("café.jpg", jpeg_bytes()), ("café.txt", b"a cafe"), ("ok.jpg", jpeg_bytes())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    [status], [raw] = run_local(tmp_path, shard_source(tmp_path / "old-{000000..000000}.tar"))
    assert list(status["status"]) == ["ok", "ok"]
    assert list(status["key"]) == ["old-old-000000-caf_xe9", "old-old-000000-ok"]
    assert status["source_id"][0].endswith("old-000000.tar#caf\\xe9")
    assert json.loads(raw["r0000000"]["meta"]) == {"txt": "a cafe"}
