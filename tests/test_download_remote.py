"""download_part with remote inputs: HTTP manifests and S3 URLs, reruns that fetch only what failed (the raw-cache
keep), and the retry-failed command. Real servers on 127.0.0.1 (tests/httpserver.py, moto_server through the
real aws CLI). Source shards: test_source_shards.py; the keep itself: test_rawcache.py."""

import hashlib
import io
import json
import tarfile

import pandas as pd
from conftest import jpeg_bytes
from httpserver import Reply
from servers import ALLOW_LOOPBACK
from test_download import assert_ledger, read_raw

from shardsmith.download import download_part, main
from shardsmith.rawcache import mark_failed
from shardsmith.s3 import upload
from shardsmith.sources import plan_parts

FAST = dict(
    concurrency=4, per_host_concurrency=4, connect_timeout_s=2, read_timeout_s=1, request_timeout_s=2,
    retries=2, backoff_s=0.05, backoff_max_s=0.2, part_deadline_s=60, **ALLOW_LOOPBACK,
)  # fmt: skip


def run(tmp_path, source: dict, s3=None, part_size: int = 100, **settings):
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
    [(status, raw)] = run(tmp_path, manifest_source(tmp_path / "m.parquet", hash_column="md5"))
    assert reasons(status) == ["ok", "hash_mismatch", "ok", "ok", "not_found", "not_an_image"]
    assert list(status["http_status"]) == [200, 200, 200, 200, 404, 200]
    assert list(status["attempts"]) == [1, 1, 1, 2, 1, 1]
    assert [raw[f"r{i:07d}"]["img"] for i in (0, 2, 3)] == [imgs[0], imgs[2], imgs[3]]
    assert json.loads(raw["r0000003"]["meta"]) == {"caption": "d", "md5": md5[3], "url": rows[3]["url"]}
    with tarfile.open(tmp_path / "raw" / "web-000000.tar") as tar:  # written as they arrived: only ok records
        assert sorted(m.name for m in tar) == [f"r{i:07d}.{e}" for i in (0, 2, 3) for e in ("img", "meta")]


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
    [(first, _)] = run(tmp_path, src, read_timeout_s=0.3, retries=1)
    assert reasons(first) == ["ok", "server_error", "ok", "not_found", "timeout"]
    counts = {p: s.count(p) for p in ("/ok0.jpg", "/flaky.jpg", "/ok2.jpg", "/gone.jpg", "/slow.jpg")}
    assert counts == {"/ok0.jpg": 1, "/flaky.jpg": 2, "/ok2.jpg": 1, "/gone.jpg": 1, "/slow.jpg": 2}

    s.route("/flaky.jpg", Reply(body=imgs[1]))  # the server is back
    s.route("/slow.jpg", Reply(body=imgs[1]))
    snakemake_deletes_outputs(tmp_path)
    [(second, raw)] = run(tmp_path, src)
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
    [(third, _)] = run(tmp_path, src)
    assert third.equals(second) and {p: s.count(p) for p in counts} == after


def test_kept_records_are_published_only_while_the_guard_allows_them(tmp_path, http_server):
    """Bytes kept in the raw cache from a run that allowed a network are not reused once it is no longer
    allowed: a rerun refuses them (nothing fetched) and the raw tar no longer holds them."""
    s = http_server
    img = jpeg_bytes()
    write_manifest(tmp_path / "m.parquet", [{"url": s.route("/a.jpg", Reply(body=img)), "caption": "a"}])
    src = manifest_source(tmp_path / "m.parquet")
    [(first, _)] = run(tmp_path, src)
    assert reasons(first) == ["ok"] and s.count("/a.jpg") == 1

    snakemake_deletes_outputs(tmp_path)
    [(second, raw)] = run(tmp_path, src, allow_networks=[])
    assert reasons(second) == ["blocked_address"] and "127.0.0.1 (loopback)" in second["detail"][0]
    assert raw == {} and s.count("/a.jpg") == 1


def test_a_changed_record_is_fetched_again_and_captions_follow_the_manifest(tmp_path, http_server):
    s = http_server
    a, b, c = (jpeg_bytes(color=(1, i * 60, 1)) for i in range(3))
    urls = [s.route("/a.jpg", Reply(body=a)), s.route("/b.jpg", Reply(body=b)), s.route("/c.jpg", Reply(body=c))]
    write_manifest(tmp_path / "m.parquet", [{"url": urls[0], "caption": "one"}, {"url": urls[1], "caption": "two"}])
    run(tmp_path, manifest_source(tmp_path / "m.parquet"))
    # the manifest changes: a caption is fixed, the second record now points elsewhere
    write_manifest(tmp_path / "m.parquet", [{"url": urls[0], "caption": "ONE"}, {"url": urls[2], "caption": "two"}])
    snakemake_deletes_outputs(tmp_path)
    [(status, raw)] = run(tmp_path, manifest_source(tmp_path / "m.parquet"))
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
    run(tmp_path, manifest_source(tmp_path / "m.parquet"), part_size=2, retries=0)  # parts: [ok, gone], [down, ok2]
    keep = tmp_path / "raw" / ".keep"
    assert mark_failed(tmp_path / "raw", {"server_error"}, dry_run=True) == {"web-000001": {"server_error": 1}}
    assert not list(keep.glob("*.retry"))
    (tmp_path / "config.yaml").write_text(json.dumps({"dataset": "raw", "paths": {"raw": str(tmp_path)}}))
    assert main(["retry-failed", str(tmp_path / "config.yaml")]) == 0
    assert [p.name for p in keep.glob("*.retry")] == ["web-000001.retry"]
    assert main(["retry-failed", str(tmp_path / "config.yaml"), "--reasons", "not_found"]) == 0
    assert sorted(p.name for p in keep.glob("*.retry")) == ["web-000000.retry", "web-000001.retry"]


# --- S3 ----------------------------------------------------------------------------------------------


def test_s3_urls_in_a_manifest_are_fetched_with_the_aws_cli(tmp_path, s3_server, s3_bucket):
    img = jpeg_bytes()
    (tmp_path / "a.jpg").write_bytes(img)
    (tmp_path / "page.jpg").write_bytes(b"<!doctype html><html></html>")
    upload(str(tmp_path / "a.jpg"), f"s3://{s3_bucket}/img/a.jpg", s3_server)
    upload(str(tmp_path / "page.jpg"), f"s3://{s3_bucket}/img/page.jpg", s3_server)
    rows = [{"url": f"s3://{s3_bucket}/img/{n}", "caption": n} for n in ("a.jpg", "missing.jpg", "page.jpg")]
    rows.append({"url": "s3://no-such-bucket-here/x.jpg", "caption": "x"})
    write_manifest(tmp_path / "m.parquet", rows)
    # each object is one `aws s3 cp` (a CLI start-up of about a second): allow for it on a busy machine
    [(status, raw)] = run(tmp_path, manifest_source(tmp_path / "m.parquet"), s3=s3_server, request_timeout_s=60)
    assert reasons(status)[:3] == ["ok", "not_found", "not_an_image"]
    assert reasons(status)[3] in ("no_such_bucket", "not_found")
    assert list(status["attempts"]) == [1, 1, 1, 1]
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
