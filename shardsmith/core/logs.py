"""Rule logs: route a script's output into its rule log, and turn user errors into one readable line."""

import logging
import os
import sys
import time
import traceback
from collections.abc import Callable

from shardsmith.core.errors import ConfigError
from shardsmith.core.stopping import STOPPED_EXIT_CODE, Stopped, stop_on_sigterm

LOG_FORMAT = "%(asctime)s %(levelname)s %(message)s"


def to_rule_log(path: str) -> None:
    """Send stdout, stderr and logging of this job to the rule's log file."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    stream = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - lives as long as the job
    sys.stdout = sys.stderr = stream
    logging.basicConfig(stream=stream, level=logging.INFO, format=LOG_FORMAT, force=True)


def run_job(log_path: str, job: Callable[[], object], expected: tuple[type[BaseException], ...] = ()) -> None:
    """Run a job with its output in the rule log; errors the user can fix end as one line, not a traceback.

    The one-line message goes to the log and to the real stderr (what Snakemake shows); the traceback
    only to the log, and only with SHARDSMITH_DEBUG=1. SIGTERM (SLURM's time limit, preemption, scancel)
    and SIGINT stop the job cleanly (shardsmith.core.stopping): it ends with STOPPED_EXIT_CODE after its
    temporary files are removed and, in jobs that commit progress, after a last commit.
    """
    real_stderr = sys.__stderr__
    to_rule_log(log_path)
    started = time.monotonic()
    try:
        with stop_on_sigterm():
            job()
        print(resources_line(time.monotonic() - started))
    except Stopped as e:
        message = f"shardsmith: {e}; what it committed is kept and its rerun goes on from there"
        print(message + "\n" + resources_line(time.monotonic() - started))
        print(message + f"\n(log: {log_path})", file=real_stderr)
        sys.exit(STOPPED_EXIT_CODE)
    except (ConfigError, *expected) as e:
        message = f"shardsmith: {e}"
        if getattr(e, "hint", ""):  # e.g. S3Error: what to do about it
            message += f"\n  fix: {e.hint}"
        print(message, file=sys.stderr)
        if os.environ.get("SHARDSMITH_DEBUG"):
            traceback.print_exc()
        print(message + f"\n(log: {log_path})", file=real_stderr)
        sys.exit(1)


def resources_line(wall_s: float) -> str:
    """The job's peak memory and CPU time, its own and its finished children's (a forked resize process), for
    sizing a cluster's requests from real jobs: the last line of every rule log."""
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss over exec from the process that started the job
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM")) / 1024
    except (OSError, StopIteration):
        peak = own.ru_maxrss / 1024
    child = children.ru_maxrss / 1024
    return f"resources: peak_rss_mib={peak:.1f} child_peak_rss_mib={child:.1f} cpu_s={cpu:.2f} wall_s={wall_s:.2f}"


class ProgressLog:
    """A progress line into the rule log (count, rate, ETA) every `every` items or `seconds`, and at the end.

    Plain lines rather than a tqdm bar: a rule log is a file, read with `tail -f` or after the fact.
    """

    def __init__(
        self,
        label: str,
        total: int | None = None,
        every: int = 1000,
        seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label, self.total, self.every, self.seconds, self.clock = label, total, max(1, every), seconds, clock
        self.done = 0
        self.started = self.last = clock()
        self.log = logging.getLogger("shardsmith.progress")

    def update(self, n: int = 1, **counts: int) -> None:
        before, self.done = self.done, self.done + n
        now = self.clock()
        if self.done // self.every > before // self.every or now - self.last >= self.seconds:
            self._line(now, counts)

    def finish(self, **counts: int) -> None:
        self._line(self.clock(), counts, final=True)

    def _line(self, now: float, counts: dict[str, int], final: bool = False) -> None:
        self.last = now
        took = max(now - self.started, 1e-9)
        rate = self.done / took
        of = f"/{self.total}" if self.total is not None else ""
        extra = f" ({', '.join(f'{v} {k}' for k, v in counts.items())})" if counts else ""
        line = f"{self.label}: {self.done}{of} records{extra}, {rate:.1f} records/s"
        if final:
            line += f", done in {took:.1f} s"
        elif self.total and rate > 0:
            line += f", about {(self.total - self.done) / rate:.0f} s left"
        self.log.info(line)
