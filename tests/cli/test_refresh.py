"""Scheduled refreshes without running the workflow (shardsmith.cli.refresh): the refresh command, reading which
jobs ran, the lock of tools/schedule/refresh.sh and the schedule examples."""

import fcntl
import re
import shutil
import subprocess
import time

import pytest
from workflow_helpers import REPO

from shardsmith.__main__ import main as shardsmith_main
from shardsmith.cli.refresh import RERUN_TRIGGERS, jobs_run, refresh_commands, summarize

SCHEDULE = REPO / "tools" / "schedule"


def test_refresh_replans_the_sources_then_builds_without_the_code_trigger():
    plan, build = refresh_commands("cfg.yaml", 4, snakemake="snakemake", extra=["--config", "version=2026-11-22"])
    for cmd in (plan, build):
        triggers = cmd[cmd.index("--rerun-triggers") + 1 : cmd.index("--max-checksum-file-size")]
        assert triggers == list(RERUN_TRIGGERS) and "code" not in triggers and "mtime" in triggers
        assert cmd[cmd.index("--max-checksum-file-size") + 1] == "64MB"
        assert cmd[-2:] == ["--config", "version=2026-11-22"]
        assert cmd[cmd.index("--snakefile") + 1] == str(REPO / "Snakefile")
    assert plan[plan.index("--forcerun") + 1] == "plan_parts" and plan[plan.index("--until") + 1] == "plan_parts"
    assert "--forcerun" not in build and "--until" not in build and "--rerun-incomplete" in build


SNAKEMAKE_LOG = """\
Building DAG of jobs...
[Sun Nov 22 09:36:56 2026]
localcheckpoint plan_parts:
    output: /r/work/demo/plan/parts
    jobid: 0
    reason: Forced execution
    resources: tmpdir=/tmp
DAG of jobs will be updated after completion.
[Sun Nov 22 09:36:57 2026]
localrule download_part:
    input: /r/work/demo/plan/parts/cc3m_style-000001.parquet
    jobid: 12
    reason: Updated input files: /r/work/demo/plan/parts/cc3m_style-000001.parquet
    wildcards: part=cc3m_style-000001
    resources: tmpdir=/tmp
rule write_shard:
    wildcards: shard=000003
Finished jobid: 12 (Rule: download_part)
localrule all:
    jobid: 1
"""


def test_jobs_run_are_read_from_the_snakemake_log():
    jobs = jobs_run(SNAKEMAKE_LOG)
    assert jobs == [
        ("plan_parts", {}),
        ("download_part", {"part": "cc3m_style-000001"}),
        ("write_shard", {"shard": "000003"}),
        ("all", {}),
    ]
    text = summarize(jobs)
    assert "4 jobs ran" in text and "download_part x1: cc3m_style-000001" in text
    assert summarize([]) == "refresh: nothing changed, no job ran"


def test_a_refresh_that_only_read_the_sources_again_says_nothing_changed():
    """Every refresh forces plan_parts; when nothing else ran, the data did not change: said so, not '1 jobs ran'."""
    text = summarize([("plan_parts", {})])
    assert text.startswith("refresh: nothing changed") and "jobs ran" not in text
    assert "2 jobs ran" in summarize([("plan_parts", {}), ("download_part", {"part": "web-000001"})])


def test_jobs_run_on_slurm_count_a_retried_job_once_and_not_the_logs_shown():
    """With the cluster profile a failed job is retried (`retries: 2`) and its logs are copied into Snakemake's
    own (show-failed-logs), each with its own Snakemake's job headers: one job, not nine."""
    rule = "=" * 80
    attempt = (
        "rule plan_publish:\n    jobid: 2\n"
        "Error in rule plan_publish:\n    message: SLURM-job '7' failed\n"
        f"Logfile logs/slurm/rule_plan_publish/7.log:\n{rule}\nrule plan_publish:\n    jobid: 0\n"
        f"localrule plan_publish:\n    jobid: 0\nLogfile logs/demo/plan_publish.log:\n{rule}\nshardsmith: x\n{rule}\n"
        f"{rule}\nTrying to restart job 2.\n"
    )
    jobs = jobs_run(
        "rule download_part:\n    wildcards: part=web-000001\nrule download_part:\n    wildcards: part=web-000002\n"
        + attempt * 3
    )
    assert jobs == [
        ("download_part", {"part": "web-000001"}),
        ("download_part", {"part": "web-000002"}),
        ("plan_publish", {}),
    ]
    assert summarize(jobs).splitlines()[-1] == "  plan_publish x1"


def test_refresh_sh_skips_while_another_refresh_holds_the_lock(tmp_path):
    lock = tmp_path / ".shardsmith-refresh.lock"
    (tmp_path / "config.yaml").write_text("dataset: x\n")
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        started = time.monotonic()
        proc = subprocess.run(
            [str(SCHEDULE / "refresh.sh"), "config.yaml"], cwd=tmp_path, capture_output=True, text=True, timeout=60
        )
        assert time.monotonic() - started < 10
    assert proc.returncode == 0 and "another refresh holds" in proc.stdout and "skipping" in proc.stdout
    assert not (tmp_path / ".snakemake").exists()  # snakemake never started


def test_a_failed_refresh_says_it_failed(tmp_path, capsys):
    (tmp_path / "bad.yaml").write_text("dataset: Not A Name\n")
    code = shardsmith_main(
        [
            "refresh",
            "--configfile",
            str(tmp_path / "bad.yaml"),
            "--directory",
            str(tmp_path),
            "--workflow-profile",
            "none",
        ]
    )
    err = capsys.readouterr().err
    assert code != 0 and "refresh: FAILED: snakemake exited with" in err and "nothing changed" not in err


def test_snakemake_options_are_not_taken_as_abbreviations_of_the_wrappers_own():
    with pytest.raises(SystemExit):  # --configfile is required: `--config` must not count as it
        shardsmith_main(["refresh", "--config", "version=v2"])


def test_refresh_sh_needs_a_config():
    proc = subprocess.run([str(SCHEDULE / "refresh.sh")], capture_output=True, text=True)
    assert proc.returncode == 2 and "usage:" in proc.stderr


def test_schedule_examples_call_refresh_sh():
    cron = [
        line
        for line in (SCHEDULE / "crontab").read_text().splitlines()
        if line and not line.startswith("#") and "=" not in line.split()[0]
    ]
    assert len(cron) == 1 and len(cron[0].split()[:5]) == 5 and "tools/schedule/refresh.sh" in cron[0]
    scron = (SCHEDULE / "scrontab").read_text()
    assert re.search(r"^#SCRON --time=", scron, re.M) and re.search(
        r"^[\d*]+ [\d*]+ \* \* \* .*refresh\.sh", scron, re.M
    )
    assert "refresh.sh" in (SCHEDULE / "shardsmith-refresh.service").read_text()
    assert "OnCalendar=" in (SCHEDULE / "shardsmith-refresh.timer").read_text()
    for text in (cron[0], scron):
        assert "AWS_SECRET" not in text and "AWS_ACCESS_KEY" not in text


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="needs systemd-analyze")
def test_systemd_units_are_valid(tmp_path):
    service = (SCHEDULE / "shardsmith-refresh.service").read_text()
    service = service.replace("/opt/shardsmith/tools/schedule/refresh.sh", str(SCHEDULE / "refresh.sh"))
    service = service.replace("User=datasets", "User=root").replace("/data/mydataset", str(tmp_path))
    (tmp_path / "shardsmith-refresh.service").write_text(service)
    shutil.copy(SCHEDULE / "shardsmith-refresh.timer", tmp_path)
    proc = subprocess.run(
        ["systemd-analyze", "verify", "shardsmith-refresh.service", "shardsmith-refresh.timer"],
        cwd=tmp_path, capture_output=True, text=True,
    )  # fmt: skip
    assert proc.returncode == 0 and "shardsmith-refresh" not in proc.stderr, proc.stderr


def test_a_config_that_cannot_be_read_is_said_in_one_line_before_snakemake_starts(tmp_path, capsys):
    """A missing or unparsable config file (refresh.sh passes whatever path it was given): one line, exit 2,
    no Snakemake traceback, no Snakemake run in the folder."""
    (tmp_path / "broken.yaml").write_text("dataset: [unclosed\n")
    (tmp_path / "list.yaml").write_text("- dataset\n")
    for name, said in (
        ("missing.yaml", "cannot read"),
        ("broken.yaml", "is not valid YAML"),
        ("list.yaml", "holds no config"),
    ):
        argv = ["refresh", "--configfile", str(tmp_path / name), "--directory", str(tmp_path)]
        assert shardsmith_main([*argv, "--workflow-profile", "none"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("shardsmith: refresh: ") and said in err and str(tmp_path / name) in err
        assert err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / ".snakemake").exists()
