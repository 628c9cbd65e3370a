"""Downloading inside the real workflow: snakemake runs with an HTTP manifest and S3 source shards (real
servers on 127.0.0.1), `make retry-failed`'s two steps, and a run killed in the middle of a download."""

import json
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
import yaml
from generated import jpeg_bytes
from httpserver import Reply
from servers import ALLOW_LOOPBACK
from workflow_helpers import REPO, demo_config, run_workflow, snakemake_cmd

from shardsmith.core.leftovers import find_leftovers
from shardsmith.storage.s3 import upload
from tests.download.test_part import shard_tar

pytestmark = pytest.mark.workflow
FAST = {
    "retries": 1,
    "backoff_s": 0.05,
    "backoff_max_s": 0.1,
    "connect_timeout_s": 5,
    "read_timeout_s": 5,
    **ALLOW_LOOPBACK,
}


def web_config(root, sources: list[dict], **overrides) -> dict:
    config = demo_config(root / "unused", root, sources=sources, part_size=4, samples_per_shard=4)
    config.update(dataset="web", validate={"min_shards": 1}, publish={"dest": None}, **overrides)
    return config


def mtimes(root, *patterns) -> dict[str, float]:
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for pat in patterns for p in sorted(root.glob(pat))}


def test_http_manifest_and_s3_shards_end_to_end_then_retry_failed(tmp_path, http_server, s3_server, s3_bucket):
    s = http_server
    imgs = [jpeg_bytes(color=(i * 30, 120, 60)) for i in range(7)]
    noai = [("Content-Type", "image/jpeg"), ("X-Robots-Tag", "noai")]
    rows = [{"url": s.route(f"/g{i}.jpg", Reply(body=imgs[i])), "caption": f"good photo {i}"} for i in range(6)]
    rows += [
        {"url": s.url("/gone.jpg"), "caption": "a 404"},
        {"url": s.route("/page.jpg", Reply(body=b"<!DOCTYPE html><html>error</html>")), "caption": "html as jpeg"},
        {"url": s.route("/flaky.jpg", Reply(503, b"")), "caption": "down during the first run"},
        {"url": s.route("/noai.jpg", Reply(body=imgs[6], headers=noai)), "caption": "opted out"},
    ]  # parts of 4: web-000000 all good, web-000001 two final failures, web-000002 flaky + opted out
    root = tmp_path / "run"
    root.mkdir()
    pd.DataFrame(rows).to_parquet(root / "manifest.parquet", index=False)
    shards = [
        {
            "a": {"jpg": imgs[0], "json": b'{"description": "archive photo a"}'},
            "b": {"jpg": imgs[1], "txt": b"archive b"},
        },
        {"c": {"jpg": imgs[2], "txt": b"archive c"}, "d": {"txt": b"caption without an image"}},
    ]
    for i, samples in enumerate(shards):
        (tmp_path / f"s{i}.tar").write_bytes(shard_tar(samples))
        upload(str(tmp_path / f"s{i}.tar"), f"s3://{s3_bucket}/old/old-00000{i}.tar", s3_server)
    sources = [
        {"name": "web", "type": "manifest", "path": str(root / "manifest.parquet")},
        {"name": "old", "type": "shards", "path": f"s3://{s3_bucket}/old/old-{{000000..000001}}.tar"},
    ]
    s3 = {"endpoint_url": s3_server.endpoint_url, "region": s3_server.region, "aws_cli": s3_server.aws_cli}
    config = web_config(root, sources, download=FAST, s3=s3)
    target = str(root / "output" / "web" / "stats.json")  # index_shards: refuses a ledger that does not add up
    run_workflow(root, config, target)

    stats = json.loads((root / "output" / "web" / "stats.json").read_text())
    assert stats["input_records"] == 14
    assert (stats["published"], stats["rejected"]) == (9, 5)
    assert stats["rejected_by_reason"] == {
        "download/not_found": 1, "download/not_an_image": 1, "download/server_error": 1,
        "download/opted_out": 1, "download/no_image": 1,
    }  # fmt: skip
    rejected = pd.read_parquet(root / "output" / "web" / "rejected.parquet")
    assert "HTTP 503" in rejected.set_index("reason").loc["server_error", "detail"]
    goods = [f"/g{i}.jpg" for i in range(6)]
    assert [s.count(p) for p in goods] == [1] * 6 and s.count("/flaky.jpg") == 2
    log = (root / "logs" / "web" / "download_part" / "web-000002.log").read_text()
    assert "records done" in log and "records/s" in log  # progress with counts and rate
    untouched = ["raw/web/web-000000.*", "raw/web/web-000001.*", "raw/web/old-*", "work/web/processed/web-00000[01].*"]
    before = mtimes(root, *untouched)
    assert len(before) == 4 + 4 + 6

    # the server is back: retry only what failed for a transient reason
    s.route("/flaky.jpg", Reply(body=imgs[5]))
    retry = subprocess.run(
        [sys.executable, "-m", "shardsmith", "retry-failed", "config.yaml"],
        cwd=root, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, check=True,
    )  # fmt: skip
    assert "web-000002: 1 records to refetch (server_error 1)" in retry.stdout
    assert "1 parts with 1 failed records" in retry.stdout
    run_workflow(root, config, target)

    stats = json.loads((root / "output" / "web" / "stats.json").read_text())
    assert (stats["input_records"], stats["published"], stats["rejected"]) == (14, 10, 4)
    assert "download/server_error" not in stats["rejected_by_reason"]
    assert [s.count(p) for p in goods] == [1] * 6  # successes were not fetched again
    assert (s.count("/flaky.jpg"), s.count("/gone.jpg"), s.count("/noai.jpg"), s.count("/page.jpg")) == (3, 1, 1, 1)
    assert mtimes(root, *untouched) == before  # other parts were neither downloaded nor processed again
    manifest = pd.read_parquet(root / "output" / "web" / "manifest.parquet")
    assert len(manifest) == 10 and manifest["source_id"].is_unique
    sizes = json.loads((root / "output" / "web" / "sizes.json").read_text())
    assert list(sizes.values()) == [4, 4, 2]  # the shards were planned and written again, uniform


def test_killed_run_resumes_with_only_the_unfinished_part(tmp_path, http_server):
    s = http_server
    img = jpeg_bytes()
    fast = [s.route(f"/f{i}.jpg", Reply(body=img)) for i in range(4)]
    slow = [s.route(f"/s{i}.jpg", Reply(body=img, delay=120)) for i in range(4)]
    root = tmp_path / "run"
    root.mkdir()
    rows = [{"url": u, "caption": f"photo {i}"} for i, u in enumerate(fast + slow)]
    pd.DataFrame(rows).to_parquet(root / "manifest.parquet", index=False)
    source = {"name": "web", "type": "manifest", "path": str(root / "manifest.parquet")}
    config = web_config(root, [source], download={**FAST, "read_timeout_s": 120})  # the slow part just hangs
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    cmd = snakemake_cmd(root, "--cores", "2")  # both parts download at once
    stats = root / "output" / "web" / "stats.json"
    proc = subprocess.Popen(
        [*cmd, str(stats)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        # the first part's job has written its last line (killed before Snakemake records it as done, it
        # is rerun from its raw cache: nothing fetched again, which the counts below also show)
        log = root / "logs" / "web" / "download_part" / "web-000000.log"
        deadline = time.time() + 120
        while time.time() < deadline and not (
            s.count("/s0.jpg") and log.exists() and "web-000000: 4 samples" in log.read_text()
        ):
            time.sleep(0.1)
        assert s.count("/s0.jpg") == 1, "the second part's download never started"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # like a node failure: no clean-up at all
        proc.wait()
    # one host's records go in turn (another every 2 s while they stall): not every slow one had started
    before = [s.count(f"/s{i}.jpg") for i in range(4)]
    assert not (root / "raw/web/web-000001.tar").exists()  # no half-written part at its final path
    assert not (root / "raw/web/.keep/web-000001.json").exists()
    # nor a half-resized one: the job was killed while its resize process still waited for images
    assert not [p for p in (root / "work/web/processed").glob("web-000001.*") if not p.name.startswith(".")]

    for i in range(4):
        s.route(f"/s{i}.jpg", Reply(body=img))
    run_workflow(root, config, "--unlock")
    run_workflow(root, config, "--rerun-incomplete", str(stats))
    assert [s.count(f"/f{i}.jpg") for i in range(4)] == [1] * 4  # the finished part was kept
    assert [s.count(f"/s{i}.jpg") for i in range(4)] == [n + 1 for n in before]  # the killed one was redone
    result = json.loads(stats.read_text())
    assert (result["input_records"], result["published"], result["rejected"]) == (8, 8, 0)
    assert find_leftovers([root]) == []  # the killed jobs' temporary files (both processes') went with the rerun


def test_refusals_land_in_the_ledger_with_their_reasons_and_in_the_summary(tmp_path, http_server):
    """A manifest from strangers: every refused row is a ledger row with its reason and detail, counted in
    stats.json and the end-of-run summary. All traffic stays on loopback: the server is allowed by its name
    (localhost) only, so its numeric address stands in for a refused network."""
    s = http_server
    imgs = [jpeg_bytes(color=(i * 40, 90, 60)) for i in range(4)]
    s.route(
        "/robots.txt", Reply(body=b"User-agent: *\nDisallow: /private/\n", headers=[("Content-Type", "text/plain")])
    )
    s.route("/.well-known/tdmrep.json", Reply(body=b'[{"location": "/reserved/", "tdm-reservation": 1}]'))
    root = tmp_path / "run"
    (root / "data").mkdir(parents=True)
    (tmp_path / "elsewhere.jpg").write_bytes(imgs[3])
    (root / "data" / "link.jpg").symlink_to(tmp_path / "elsewhere.jpg")
    named = lambda path: s.url(path, host="localhost")  # noqa: E731
    rows = [
        {"url": s.route("/ok.jpg", Reply(body=imgs[0])).replace("127.0.0.1", "localhost"), "caption": "a fine photo"},
        {"url": s.route("/by-address.jpg", Reply(body=imgs[1])), "caption": "loopback by address"},
        {"url": named("/private/p.jpg"), "caption": "robots says no"},
        {"url": named("/reserved/r.jpg"), "caption": "rights reserved"},
        {"url": named("/ok.jpg").replace("://", "://user:pw@"), "caption": "with a password"},
        {"url": str(tmp_path / "elsewhere.jpg"), "caption": "a file outside"},
        {"url": str(root / "data" / "link.jpg"), "caption": "a link out of the folder"},
    ]
    pd.DataFrame(rows).to_parquet(root / "data" / "manifest.parquet", index=False)
    sources = [{"name": "web", "type": "manifest", "path": str(root / "data" / "manifest.parquet")}]
    config = web_config(root, sources, download={**FAST, "allow_networks": [], "allow_hosts": ["localhost"]})
    proc = run_workflow(root, config, str(root / "output" / "web" / "stats.json"))

    stats = json.loads((root / "output" / "web" / "stats.json").read_text())
    assert (stats["input_records"], stats["published"], stats["rejected"]) == (7, 1, 6)
    assert stats["rejected_by_reason"] == {
        "download/blocked_address": 1, "download/robots_disallowed": 1, "download/tdm_reserved": 1,
        "download/credentials_in_url": 1, "download/outside_allowed_folders": 2,
    }  # fmt: skip
    ledger = pd.read_parquet(root / "output" / "web" / "rejected.parquet").set_index("url")
    assert "127.0.0.1 (loopback)" in ledger.loc[rows[1]["url"], "detail"]
    assert "resolves to" in ledger.loc[rows[6]["url"], "detail"]
    assert "pw" not in ledger.loc[rows[4]["url"], "detail"]
    assert s.count("/by-address.jpg") == s.count("/private/p.jpg") == s.count("/reserved/r.jpg") == 0
    assert "download/blocked_address" in proc.stdout + proc.stderr  # the end-of-run summary
