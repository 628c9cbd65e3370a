"""The end-of-run summary (shardsmith.report.summary): a failed job's own message and log quoted, the top reasons when
nothing was published, and Snakemake's scheduler timers stopped."""

import json

from shardsmith.__main__ import main
from shardsmith.report.summary import failed_jobs, failure_text, job_message


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
    stats = {"input_records": 8, "published": 0, "rejected_by_reason": {"download/deadline": 8}}
    (out / "stats.json").write_text(json.dumps(stats))
    text = failure_text(snakemake_log(tmp_path, tmp_path / "gone.log"), str(out))
    assert "(download/deadline 8): download.part_deadline_s passed" in text and "retry-failed" in text
    assert "paths or URLs" not in text  # the URLs are fine: the servers were slow
    stats = {"input_records": 4, "published": 0, "rejected_by_reason": {"download/server_error": 3, "download/x": 1}}
    (out / "stats.json").write_text(json.dumps(stats))
    text = failure_text(snakemake_log(tmp_path, tmp_path / "gone.log"), str(out))
    assert "transient" in text and "retry-failed" in text and "paths or URLs" not in text


def test_the_end_of_a_run_stops_the_schedulers_timers_and_no_other():
    """Snakemake's scheduler leaves 1-s non-daemon timers that keep the finished process alive; onsuccess and
    onerror cancel them, and only them."""
    import threading
    from types import SimpleNamespace

    from snakemake.scheduling.job_scheduler import JobScheduler

    from shardsmith.report.summary import stop_scheduler_timers

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


def test_summary_of_a_folder_that_is_no_build_says_so_in_one_line(tmp_path, capsys):
    """A dataset's folder on the destination holds versions and `latest`, not stats.json: the user is told which
    folder to give, not shown a traceback."""
    (tmp_path / "ds" / "v2").mkdir(parents=True)
    (tmp_path / "ds" / "latest").write_text("v2\n")
    assert main(["summary", str(tmp_path / "ds")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"shardsmith: summary: {tmp_path / 'ds'} is not a built")
    assert err.rstrip().endswith(f"names {tmp_path / 'ds' / 'v2'}")
