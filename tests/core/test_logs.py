"""Job logs (shardsmith.core.logs): a job's expected error as a short message with its fix, progress lines with
counts, rate and time left, the job's peak memory and CPU time as its last line."""

import logging
import re
import subprocess
import sys

from shardsmith.core.logs import ProgressLog
from shardsmith.storage.s3 import S3Error


def test_run_job_adds_the_fix_for_s3_errors(tmp_path):
    code = (
        "import sys\n"
        "from shardsmith.core.logs import run_job; from shardsmith.storage.s3 import S3Error\n"
        "def job(): raise S3Error('no_credentials', 'Unable to locate credentials.')\n"
        "run_job(sys.argv[1], job, expected=(S3Error,))"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "job.log")], capture_output=True, text=True)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.splitlines()[:2] == [
        "shardsmith: Unable to locate credentials.",
        "  fix: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or s3.profile) where the jobs run",
    ]
    assert S3Error("unreachable", "x").hint.startswith("check s3.endpoint_url") and S3Error("weird", "x").hint == ""


def test_a_job_log_ends_with_its_peak_memory_and_cpu_time_with_its_childrens(tmp_path):
    """A job that holds 300 MiB and spins a child for CPU time: the line says at least that much of each."""
    code = (
        "import subprocess, sys, time\n"
        "from shardsmith.core.logs import run_job\n"
        "def job():\n"
        "    held = bytearray(300 << 20)\n"
        "    subprocess.run([sys.executable, '-c', 'import time; t = time.process_time()\\n"
        "while time.process_time() - t < 0.5: pass'], check=True)\n"
        "    print('done', len(held))\n"
        "run_job(sys.argv[1], job)"
    )
    log = tmp_path / "job.log"
    subprocess.run([sys.executable, "-c", code, str(log)], check=True)
    last = log.read_text().splitlines()[-1]
    got = {k: float(v) for k, v in re.findall(r"(\w+)=([\d.]+)", last)}
    assert last.startswith("resources: ") and set(got) == {"peak_rss_mib", "child_peak_rss_mib", "cpu_s", "wall_s"}
    assert got["peak_rss_mib"] >= 300 and got["cpu_s"] >= 0.5 and got["wall_s"] >= 0.5, last


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
