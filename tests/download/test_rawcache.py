"""The raw cache's keep (shardsmith.download.rawcache): a damaged keep is never reused. Real HTTP server, 127.0.0.1."""

from generated import jpeg_bytes
from httpserver import Reply

from shardsmith.download.rawcache import Keep
from tests.download.test_part import manifest_source, reasons, snakemake_deletes_outputs, write_manifest
from tests.download.test_part import run_remote as run


def test_a_damaged_keep_is_ignored_and_the_part_fetched_again(tmp_path, http_server):
    url = http_server.route("/a.jpg", Reply(body=jpeg_bytes()))
    write_manifest(tmp_path / "m.parquet", [{"url": url, "caption": "x"}])
    run(tmp_path, manifest_source(tmp_path / "m.parquet"))
    keep = Keep(tmp_path / "raw" / "web-000000.tar")
    assert keep.load() is not None
    size = keep.tar.stat().st_size
    keep.tar.unlink()
    keep.tar.write_bytes(b"\0" * 1024)  # e.g. a run killed between writing the tar and the keep's record of it
    snakemake_deletes_outputs(tmp_path)
    [(status, raw)] = run(tmp_path, manifest_source(tmp_path / "m.parquet"))
    assert reasons(status) == ["ok"] and http_server.count("/a.jpg") == 2
    keep.tar.unlink()
    keep.tar.write_bytes(b"\xff" * size)  # same size, garbage inside
    snakemake_deletes_outputs(tmp_path)
    [(status, raw)] = run(tmp_path, manifest_source(tmp_path / "m.parquet"))
    assert reasons(status) == ["ok"] and http_server.count("/a.jpg") == 3
