"""The end-of-run summary (shardsmith.report.summary): a failed job's own message and log quoted, the top reasons when
nothing was published, and Snakemake's scheduler timers stopped."""

import json

import pytest

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
    assert failed_jobs([main]) == [
        {"rule": "process_part", "log": [str(job_log)], "wildcards": "part=web-000001", "message": ""}
    ]
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


def test_failure_text_says_why_a_job_that_never_ran_failed_once_per_job(tmp_path):
    """On SLURM a job sbatch refused (an unknown partition, no sbatch) has an empty log: the reason is only in
    Snakemake's message, and each of its retries adds a block; the summary names it once, with that reason."""
    job_log = tmp_path / "plan_parts.log"
    job_log.write_text("")
    block = (
        "Error in rule plan_parts:\n"
        "    message: SLURM sbatch failed. The error message was 'sbatch: error: invalid partition specified: nosuch\n"
        "sbatch: error: Batch job submission failed: Invalid partition name specified'.\n"
        "    sbatch call:\n        sbatch --parsable --job-name shardsmith_x -p nosuch -t 720\n"
        "For further error details see the cluster/cloud log and the log files of the involved rule(s).\n"
        f"    jobid: 4\n    output: out/plan/parts\n    log: {job_log} (check log file(s) for error details)\n"
        "Trying to restart job 4.\n"
    )
    main = tmp_path / "snakemake.log"
    main.write_text(block * 3)
    lines = failure_text(str(main), str(tmp_path)).splitlines()
    assert lines[:2] == [
        "shardsmith: plan_parts failed: SLURM sbatch failed. The error message was 'sbatch: error: invalid partition"
        " specified: nosuch sbatch: error: Batch job submission failed: Invalid partition name specified'.",
        f"  log: {job_log}",
    ]
    assert len(lines) == 3 and lines[2].startswith("  Snakemake's log: ")


def test_failure_text_names_each_failed_slurm_job_once_by_its_own_log(tmp_path):
    """SLURM's Error blocks have no wildcards line and name the sbatch log after the rule's; the job's own log that
    show-failed-logs copies after a block (headers, an Error block of its own) is not part of it. Each part is
    named once, with its last attempt and the executor's message."""

    def block(part, job_id):
        logs = f"{tmp_path}/{part}.log, {tmp_path}/slurm/{job_id}.log"
        return (
            f"Error in rule download_part:\n    message: SLURM-job '{job_id}' failed, SLURM status is: 'FAILED'."
            "For further error details see the cluster/cloud log and the log files of the involved rule(s).\n"
            f"    jobid: 3\n    log: {logs} (check log file(s) for error details)\n    external_jobid: {job_id}\n"
            f"Logfile {tmp_path}/slurm/{job_id}.log:\n{'=' * 80}\nlocalrule download_part:\n"
            f"    wildcards: part=other\nLogfile {tmp_path}/{part}.log:\n{'=' * 80}\ninner\n{'=' * 80}\n"
            f"Error in rule download_part:\n    message: None\n"
            f"    log: {tmp_path}/{part}.log (check log file(s) for error details)\n{'=' * 80}\n"
        )

    main = tmp_path / "snakemake.log"
    main.write_text(block("web-000001", 11) + block("web-000002", 12) + block("web-000001", 13))
    lines = failure_text(str(main), str(tmp_path)).splitlines()
    assert lines[:-1] == [
        "shardsmith: download_part failed: SLURM-job '12' failed, SLURM status is: 'FAILED'.",
        f"  log: {tmp_path}/web-000002.log",
        f"  log: {tmp_path}/slurm/12.log",
        "shardsmith: download_part failed: SLURM-job '13' failed, SLURM status is: 'FAILED'.",
        f"  log: {tmp_path}/web-000001.log",
        f"  log: {tmp_path}/slurm/13.log",
    ]


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


@pytest.mark.timeout(120)  # a worker given fewer samples than a batch never yields one: OpenCLIP's loader waits
@pytest.mark.parametrize("shard_sizes", [[1], [3], [5, 2], [300, 300, 40]])
def test_summary_training_command_trains_on_a_small_build_with_openclips_loader(tmp_path, capsys, shard_sizes):
    """OpenCLIP asserts at least workers x GPUs shards, and drops each worker's last partial batch: the command
    printed for a small build must pass the one and give every worker a batch (its own data setup, on real
    shards, iterated)."""
    import io
    import shlex

    import webdataset as wds
    from open_clip_train.data import get_wds_dataset
    from open_clip_train.params import parse_args
    from PIL import Image

    jpg = io.BytesIO()
    Image.new("RGB", (40, 30), (200, 100, 50)).save(jpg, format="JPEG")
    for i, n in enumerate(shard_sizes):
        with wds.TarWriter(str(tmp_path / f"ds-{i:06d}.tar")) as sink:
            for k in range(n):
                sink.write({"__key__": f"k{i}_{k}", "jpg": jpg.getvalue(), "txt": "a red square"})
    sizes = {f"ds-{i:06d}.tar": n for i, n in enumerate(shard_sizes)}
    (tmp_path / "sizes.json").write_text(json.dumps(sizes))
    total = sum(shard_sizes)
    stats = {"dataset": "ds", "input_records": total, "published": total, "shards": len(sizes), "rejected": 0}
    (tmp_path / "stats.json").write_text(json.dumps({**stats, "rejected_by_reason": {}}))
    assert main(["summary", str(tmp_path)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "open_clip_train.main" in x)
    args = parse_args(shlex.split(line)[3:])
    args.world_size = 1
    data = get_wds_dataset(args, lambda image: 0, is_train=True, tokenizer=lambda text: [0])
    assert data.dataloader.num_batches > 0
    images, _ = next(iter(data.dataloader))  # a worker with fewer samples than a batch would give none
    seen = len(images)
    fewest = min(sum(shard_sizes[w :: args.workers]) for w in range(args.workers))
    assert seen > 0 and args.batch_size == min(256, fewest)


def test_a_partial_run_does_not_end_with_an_earlier_builds_summary(tmp_path, capsys):
    """A refresh first runs `--until plan_parts` over the last build's files: that run's end shows no summary,
    which would be the old version's counts; a whole run (no target, or `all`) shows it."""
    from snakemake.settings.types import DAGSettings

    from shardsmith.report.summary import print_success

    (tmp_path / "sizes.json").write_text(json.dumps({"ds-000000.tar": 3}))
    stats = {"dataset": "ds", "input_records": 3, "published": 3, "shards": 1, "rejected": 0}
    (tmp_path / "stats.json").write_text(json.dumps({**stats, "rejected_by_reason": {}}))
    for partial in (
        DAGSettings(until={"plan_parts"}, forcerun={"plan_parts"}),
        DAGSettings(omit_from={"publish_dataset"}),
        DAGSettings(targets={"validate_dataset"}),
        DAGSettings(targets={str(tmp_path / "sizes.json")}),
    ):
        print_success(str(tmp_path), None, partial)
        assert capsys.readouterr().out == ""
    for whole in (
        DAGSettings(),
        DAGSettings(targets={"all"}),
        None,
        DAGSettings(targets={str(tmp_path / "stats.json")}),
    ):
        print_success(str(tmp_path), None, whole)
        assert "dataset ds: 3 input records -> 3 published" in capsys.readouterr().out


def test_summary_of_a_folder_with_another_tools_stats_json_says_so_in_one_line(tmp_path, capsys):
    """A folder whose stats.json is another tool's (or cut short): one line naming the folder, no traceback."""
    (tmp_path / "sizes.json").write_text(json.dumps({"ds-000000.tar": 3}))
    for stats in ('{"count": 3}', "{cut", "[1, 2]"):
        (tmp_path / "stats.json").write_text(stats)
        assert main(["summary", str(tmp_path)]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"shardsmith: summary: {tmp_path}: stats.json or sizes.json")


def test_when_nothing_was_published_the_hint_names_the_setting_of_the_top_reason(tmp_path):
    """Every record left out by a caption language rule, a filter or a selection: the settings named are those
    rules', not captions.fields or the sources' paths."""
    out = tmp_path / "out"
    out.mkdir()
    for reason, says in (
        ("caption/language", "captions.languages"),
        ("caption/too_few_words", "captions.min_words"),
        ("filter/timeout", "check the filters"),
        ("select/top_clip", "check the select rules"),
        ("embed/low_similarity", "embed.min_similarity"),
        ("dedupe/already_published", "already in a published version"),
    ):
        stats = {"input_records": 4, "published": 0, "rejected_by_reason": {reason: 4}}
        (out / "stats.json").write_text(json.dumps(stats))
        text = failure_text(snakemake_log(tmp_path, tmp_path / "gone.log"), str(out))
        assert f"all 4 input records were rejected ({reason} 4): " in text and says in text, reason
        assert "captions.fields" not in text and "paths or URLs" not in text and "retry-failed" not in text


def test_the_training_command_is_one_shell_word_for_a_folder_with_a_quote(tmp_path, capsys):
    """A build under /home/o'brien: the printed command, pasted into a shell, gets the shard pattern whole."""
    import shlex

    from braceexpand import braceexpand

    out = tmp_path / "o'brien's data" / "v1"
    out.mkdir(parents=True)
    (out / "sizes.json").write_text(json.dumps({"ds-000000.tar": 2, "ds-000001.tar": 1}))
    stats = {"dataset": "ds", "input_records": 3, "published": 3, "shards": 2, "rejected": 0}
    (out / "stats.json").write_text(json.dumps({**stats, "rejected_by_reason": {}}))
    assert main(["summary", str(out)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "open_clip_train.main" in x)
    argv = shlex.split(line)
    pattern = argv[argv.index("--train-data") + 1]
    assert list(braceexpand(pattern)) == [str(out / "ds-000000.tar"), str(out / "ds-000001.tar")]
