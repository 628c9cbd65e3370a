"""Errors a user can cause end in a short message that names the key or path and says what to do, with no
traceback (unless SHARDSMITH_DEBUG=1); progress lines and the end-of-run summaries. Snakemake runs on
generated data; the message helpers are also tested on their own."""

import json
import logging
import os
import re
import socket
import subprocess
import sys

import pytest
from workflow_helpers import demo_config, run_workflow

from shardsmith.config import schema_error_message
from shardsmith.demo import make_demo
from shardsmith.logs import ProgressLog
from shardsmith.s3 import S3Error
from shardsmith.summary import failed_jobs, failure_text, job_message


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("inputs") / "data"
    make_demo(path)
    return path


def shardsmith_lines(text: str) -> list[str]:
    """Our message: from the first `shardsmith:` line up to the next line Snakemake printed."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("shardsmith:"))
    block = [lines[start]]
    for line in lines[start + 1 :]:
        if not line.startswith("  "):
            break
        block.append(line)
    return block


def set_key(config: dict, dotted: str, value: object) -> dict:
    node = config
    *head, last = dotted.split(".")
    for part in head:
        node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
    if value is None:
        del node[last]
    else:
        node[last] = value
    return config


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("samples_per_shard", "lots", "samples_per_shard = 'lots' is not of type 'integer'"),
        ("resize.qualty", 50, "resize.qualty: unknown key; did you mean 'resize.quality'?"),
        ("resize.quality", 500, "resize.quality = 500 is greater than the maximum of 100"),
        ("sources.0.type", "website", "sources[0].type = 'website' is not one of"),
        ("paths.work", None, "paths.work: missing; this key is required"),
    ],
)
def test_schema_errors_are_one_line_naming_the_key(data, tmp_path, key, value, expected):
    config = set_key(demo_config(data, tmp_path), key, value)
    proc = run_workflow(tmp_path, config, check=False)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith(f"shardsmith: config error: {expected}"), proc.stderr
    assert len(lines) == 2 and "config.yaml" in lines[1]  # where to fix it
    assert "Traceback" not in proc.stderr and "Failed validating" not in proc.stderr
    assert not (tmp_path / "work").exists()


def test_debug_shows_snakemakes_full_schema_error(data, tmp_path, monkeypatch):
    monkeypatch.setenv("SHARDSMITH_DEBUG", "1")
    proc = run_workflow(tmp_path, demo_config(data, tmp_path, samples_per_shard="lots"), check=False)
    assert proc.returncode != 0 and "Failed validating" in proc.stderr


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (
            lambda c, d, t: set_key(c, "paths.output", str(t / "work" / "out")),
            r"paths\.work \(.*\) and paths\.output \(.*\) overlap",
        ),
        (lambda c, d, t: set_key(c, "paths.raw", str(d / "photos")), r"paths\.raw \(.*photos\) overlaps input folder"),
        (
            lambda c, d, t: set_key(c, "sources.0.path", str(d / "nope.tsv")),
            r"sources\[0\] \(cc3m_style\)\.path: manifest .*nope\.tsv does not exist",
        ),
    ],
)
def test_path_errors_name_the_key_and_the_path(data, tmp_path, edit, expected):
    proc = run_workflow(tmp_path, edit(demo_config(data, tmp_path), data, tmp_path), check=False)
    assert proc.returncode != 0
    assert re.match(rf"shardsmith: config error: {expected}", proc.stderr.strip()), proc.stderr
    assert len(proc.stderr.strip().splitlines()) <= 2 and "Traceback" not in proc.stderr


def test_empty_input_ends_with_what_failed_and_how_to_fix_it(data, tmp_path):
    (tmp_path / "empty.tsv").write_text("")
    config = demo_config(data, tmp_path / "run")
    config["sources"] = [
        {"name": "web", "type": "manifest", "path": str(tmp_path / "empty.tsv"), "columns": ["caption", "url"]}
    ]
    proc = run_workflow(tmp_path / "run", config, check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    block = shardsmith_lines(proc.stderr[proc.stderr.index("Exiting because") :])  # the onerror summary at the end
    assert block[0].startswith("shardsmith: plan_parts failed: source web") and "has no records" in block[0]
    assert "remove the source" in block[0] and any("plan_parts.log" in line for line in block)
    assert len(block) <= 4


def test_all_records_rejected_says_which_reason_and_which_setting(data, tmp_path):
    config = demo_config(data, tmp_path, resize={"max_side": 512, "min_side": 5000})
    config["sources"] = [s for s in config["sources"] if s["name"] == "photos"]  # one part: a short run
    proc = run_workflow(tmp_path, config, check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    tail = proc.stderr[proc.stderr.index("Exiting because") :]
    block = shardsmith_lines(tail)
    assert block[0].startswith("shardsmith: validate_dataset failed")
    assert any(
        re.search(
            r"all 8 input records were rejected \(resize/too_small 7, caption/no_caption 1\): check resize\.min_side",
            line,
        )
        for line in block
    )
    assert any(line.strip().startswith("ledger: ") and line.endswith("rejected.parquet") for line in block)
    assert len(block) <= 8


def test_unreachable_s3_endpoint_is_named_in_the_ledger_and_the_message(data, tmp_path, monkeypatch):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    (tmp_path / "s3.tsv").write_text("".join(f"a photo {i}\ts3://bucket/img{i}.jpg\n" for i in range(3)))
    config = demo_config(data, tmp_path / "run", s3={"endpoint_url": f"http://127.0.0.1:{port}"})
    config["sources"] = [
        {"name": "web", "type": "manifest", "path": str(tmp_path / "s3.tsv"), "columns": ["caption", "url"]}
    ]
    config["download"] = {"retries": 0}
    proc = run_workflow(tmp_path / "run", config, check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    block = shardsmith_lines(proc.stderr[proc.stderr.index("Exiting because") :])
    assert any(
        "all 3 input records were rejected (download/unreachable 3)" in line and "s3.endpoint_url" in line
        for line in block
    ), block


# --- the message helpers on their own ------------------------------------------------------------------


def test_schema_error_message_without_a_schema_error_keeps_the_first_line():
    assert schema_error_message(RuntimeError("WorkflowError:\nsomething broke\nmore")) == "something broke"


def test_run_job_adds_the_fix_for_s3_errors(tmp_path):
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "from shardsmith.logs import run_job; from shardsmith.s3 import S3Error\n"
        "def job(): raise S3Error('no_credentials', 'Unable to locate credentials.')\n"
        "run_job(sys.argv[2], job, expected=(S3Error,))"
    )
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", code, repo, str(tmp_path / "job.log")], capture_output=True, text=True)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines()[:2] == [
        "shardsmith: Unable to locate credentials.",
        "  fix: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or s3.profile) where the jobs run",
    ]
    assert S3Error("unreachable", "x").hint.startswith("check s3.endpoint_url") and S3Error("weird", "x").hint == ""


def snakemake_log(tmp_path, job_log) -> str:
    path = tmp_path / "snakemake.log"
    path.write_text(
        "Error in rule process_part:\n    message: None\n    jobid: 7\n    wildcards: part=web-000001\n"
        f"    log: {job_log} (check log file(s) for error details)\nShutting down, this might take some time.\n"
    )
    return str(path)


def test_failure_text_quotes_the_jobs_own_message_and_its_log(tmp_path):
    job_log = tmp_path / "process_part.log"
    job_log.write_text(
        "working\nshardsmith: resize.quality must be set\n  fix: set it\nTraceback (most recent call last):\n  x\n"
    )
    main = snakemake_log(tmp_path, job_log)
    assert failed_jobs([main]) == [{"rule": "process_part", "log": [str(job_log)], "wildcards": "part=web-000001"}]
    assert job_message(str(job_log)) == "resize.quality must be set\n  fix: set it"
    text = failure_text([main], str(tmp_path / "no-output"))
    assert text.splitlines()[:3] == [
        "shardsmith: process_part (part=web-000001) failed: resize.quality must be set",
        "  fix: set it",
        f"  log: {job_log}",
    ]
    assert "Traceback" not in text


def test_failure_text_names_an_unexpected_error_by_its_last_line(tmp_path):
    job_log = tmp_path / "x.log"
    job_log.write_text("Traceback (most recent call last):\n  File x\nKeyError: 'width'\n")
    text = failure_text(snakemake_log(tmp_path, job_log), str(tmp_path))
    assert (
        text.splitlines()[0] == "shardsmith: process_part (part=web-000001) failed: unexpected error: KeyError: 'width'"
    )


def test_failure_text_adds_the_top_reasons_when_nothing_was_published(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    stats = {
        "input_records": 5,
        "published": 0,
        "rejected_by_reason": {"caption/no_caption": 4, "download/not_found": 1},
    }
    (out / "stats.json").write_text(json.dumps(stats))
    text = failure_text(snakemake_log(tmp_path, tmp_path / "gone.log"), str(out))
    assert (
        "all 5 input records were rejected (caption/no_caption 4, download/not_found 1): check captions.fields" in text
    )
    assert failure_text(str(tmp_path / "no-such.log"), str(out)) == ""  # no failed job found: say nothing
    stats = {"input_records": 3, "published": 0, "rejected_by_reason": {"download/no_credentials": 3}}
    (out / "stats.json").write_text(json.dumps(stats))
    text = failure_text(snakemake_log(tmp_path, tmp_path / "gone.log"), str(out))
    assert "(download/no_credentials 3)" in text and "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" in text
    stats = {"input_records": 3, "published": 0, "rejected_by_reason": {"download/blocked_address": 3}}
    (out / "stats.json").write_text(json.dumps(stats))
    text = failure_text(snakemake_log(tmp_path, tmp_path / "gone.log"), str(out))
    assert "(download/blocked_address 3): the network guard refused their addresses" in text
    assert "download.allow_networks" in text


def test_progress_lines_have_counts_rate_and_time_left(caplog):
    now = [0.0]
    progress = ProgressLog("process web-000000", total=2500, every=1000, seconds=60, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="shardsmith.progress"):
        for _ in range(25):
            now[0] += 1.0
            progress.update(100, samples=90, rejected=10)
        progress.finish(samples=2250, rejected=250)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "process web-000000: 1000/2500 records (90 samples, 10 rejected), 100.0 records/s, about 15 s left",
        "process web-000000: 2000/2500 records (90 samples, 10 rejected), 100.0 records/s, about 5 s left",
        "process web-000000: 2500/2500 records (2250 samples, 250 rejected), 100.0 records/s, done in 25.0 s",
    ]


def test_progress_logs_at_least_every_interval_when_slow(caplog):
    now = [0.0]
    progress = ProgressLog("download x", every=10_000, seconds=60, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="shardsmith.progress"):
        for _ in range(3):
            now[0] += 61
            progress.update(1)
    assert [r.getMessage().split(",")[0] for r in caplog.records] == [
        "download x: 1 records",
        "download x: 2 records",
        "download x: 3 records",
    ]


def test_the_end_of_a_run_stops_the_schedulers_timers_and_no_other():
    """Snakemake's scheduler leaves 1-s non-daemon timers that keep the finished process alive; onsuccess and
    onerror cancel them, and only them."""
    import threading
    from types import SimpleNamespace

    from snakemake.scheduling.job_scheduler import JobScheduler

    from shardsmith.summary import stop_scheduler_timers

    open_jobs = threading.Semaphore(0)
    before = set(threading.enumerate())
    JobScheduler._schedule_reevalutation(SimpleNamespace(_open_jobs=open_jobs), 60)  # what each pass arms
    theirs = [t for t in set(threading.enumerate()) - before if isinstance(t, threading.Timer)]
    ours = threading.Timer(60, lambda: None)
    ours.start()
    try:
        assert len(theirs) == 1 and theirs[0].is_alive()
        assert stop_scheduler_timers() >= 1
        theirs[0].join(timeout=10)
        assert not theirs[0].is_alive() and not open_jobs.acquire(blocking=False)  # cancelled, not fired
        assert ours.is_alive()
    finally:
        ours.cancel()
