"""Rule logs: route a script's output into its rule log, and turn user errors into one readable line."""

import logging
import os
import sys
import traceback
from collections.abc import Callable

from shardsmith.errors import ConfigError


def to_rule_log(path: str) -> None:
    """Send stdout, stderr and logging of this job to the rule's log file."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    stream = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - lives as long as the job
    sys.stdout = sys.stderr = stream
    logging.basicConfig(stream=stream, level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", force=True)


def run_job(log_path: str, job: Callable[[], object], expected: tuple[type[BaseException], ...] = ()) -> None:
    """Run a job with its output in the rule log; errors the user can fix end as one line, not a traceback.

    The one-line message goes to the log and to the real stderr (what Snakemake shows); the traceback
    only to the log, and only with SHARDSMITH_DEBUG=1.
    """
    real_stderr = sys.__stderr__
    to_rule_log(log_path)
    try:
        job()
    except (ConfigError, *expected) as e:
        message = f"shardsmith: {e}"
        print(message, file=sys.stderr)
        if os.environ.get("SHARDSMITH_DEBUG"):
            traceback.print_exc()
        print(message + f"\n(log: {log_path})", file=real_stderr)
        sys.exit(1)
