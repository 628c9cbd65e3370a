"""Scheduled refreshes: rebuild from a grown source, run only the parts that changed, publish a new version.

    python -m shardsmith refresh --configfile my-dataset.yaml --cores 8 [more snakemake options]

(tools/schedule/refresh.sh wraps this with a lock, for cron, systemd timers and SLURM scrontab.)

What makes a refresh incremental:
- First `--forcerun plan_parts --until plan_parts`: the plan checkpoint has no input files (sources may be
  remote), so a refresh asks it to look at the sources again, in a Snakemake run of its own. Parts never
  span two input files and are cut at fixed boundaries, so old records land in byte-identical part files.
  (Forcing it inside the main run would mark every downstream job as to be run before the checkpoint
  finished, and jobs that do not wait for the checkpoint, like the card, would run for nothing.)
- Then the main run, in which Snakemake decides from the files alone what changed.
- Rerun triggers `mtime params input software-env`, not `code`: a fresh checkout gives every script a
  new mtime, and the `code` trigger would rebuild everything for that. A real change of logic calls for
  a full rebuild under a new version (run snakemake with its default triggers).
- With the `mtime` trigger Snakemake reruns a job only when an input is newer AND its checksum differs,
  for inputs up to `--max-checksum-file-size` (1 MB by default). The rewritten plan files are identical
  for old parts, but at real sizes they can exceed 1 MB, so the refresh raises the limit to 64 MB
  (the checksum must have been recorded when the job last ran: run the first build this way too).
- planning (shardsmith.shards.published) keeps records of earlier versions and leaves out new
  records whose URL or image sha256 is already published; `version: auto` names the new version.
"""

import argparse
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

from shardsmith import REPO
from shardsmith.report.summary import without_shown_logs

RERUN_TRIGGERS = ("mtime", "params", "input", "software-env")
MAX_CHECKSUM_FILE_SIZE = "64MB"
FORCED = ("plan_parts",)

_JOB = re.compile(r"^(?:local)?(?:rule|checkpoint) (\w+):$")
_WILDCARDS = re.compile(r"^\s+wildcards: (.*)$")


def refresh_commands(
    configfile: str,
    cores: int,
    snakemake: str | None = None,
    extra: list[str] | tuple[str, ...] = (),
) -> list[list[str]]:
    """The snakemake command lines of a refresh: re-plan the sources, then build what changed."""
    exe = snakemake or str(Path(sys.executable).parent / "snakemake")
    common = [
        exe, "--snakefile", str(REPO / "Snakefile"), "--configfile", configfile, "--cores", str(cores),
        "--rerun-triggers", *RERUN_TRIGGERS, "--max-checksum-file-size", MAX_CHECKSUM_FILE_SIZE,
    ]  # fmt: skip
    return [
        [*common, "--forcerun", *FORCED, "--until", *FORCED, *extra],
        [*common, "--rerun-incomplete", *extra],
    ]


def jobs_run(log_text: str) -> list[tuple[str, dict[str, str]]]:
    """(rule, wildcards) of every job a Snakemake log says it started, in order: a job retried counts once, and
    the job headers in the failed jobs' logs it shows (show-failed-logs, on in the cluster profile) not at all."""
    jobs: list[tuple[str, dict[str, str]]] = []
    in_block = False
    for line in without_shown_logs(log_text).splitlines():
        if m := _JOB.match(line):
            jobs.append((m.group(1), {}))
            in_block = True
        elif in_block and (m := _WILDCARDS.match(line)):
            jobs[-1][1].update(dict(kv.split("=", 1) for kv in m.group(1).split(", ")))
        elif not line.startswith(" "):
            in_block = False
    return list({(rule, tuple(sorted(wildcards.items()))): (rule, wildcards) for rule, wildcards in jobs}.values())


def summarize(jobs: list[tuple[str, dict[str, str]]]) -> str:
    """One line per rule: how many jobs ran and for which parts or shards. The re-plan of the sources, which
    every refresh forces, and the `all` target are not a change: with nothing else, nothing changed."""
    if all(rule in (*FORCED, "all") for rule, _ in jobs):
        replanned = " but the re-read of the sources (plan_parts)" if jobs else ""
        return f"refresh: nothing changed, no job ran{replanned}"
    counts = Counter(rule for rule, _ in jobs)
    lines = [f"refresh: {len(jobs)} jobs ran"]
    for rule, n in counts.items():
        which = [",".join(w.values()) for r, w in jobs if r == rule and w]
        lines.append(
            f"  {rule} x{n}" + (f": {' '.join(which[:20])}{' ...' if len(which) > 20 else ''}" if which else "")
        )
    return "\n".join(lines)


def snakemake_logs(directory: str | Path) -> list[Path]:
    """Snakemake's own logs in a working directory, oldest first (names are timestamps)."""
    return sorted(Path(directory, ".snakemake", "log").glob("*.snakemake.log"))


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`shardsmith refresh --configfile C [snakemake options]`, as tools/schedule/refresh.sh runs it."""
    p.epilog = "Other options are passed to snakemake (e.g. --config version=2026-11-22, --workflow-profile cluster)."
    # abbreviations stay off (the command's parser is made so): else `--config version=v2`, meant for snakemake,
    # would be taken as --configfile
    p.add_argument("--configfile", required=True)
    p.add_argument("--cores", type=int, default=1)
    p.add_argument("--directory", default=".", help="snakemake's working directory (default: here)")
    p.set_defaults(run=refresh, pass_through=True)


def config_problem(configfile: str) -> str | None:
    """Why a config file cannot be read as YAML, in one line; None when it can. Snakemake would say it with a
    traceback (a missing file) or over several lines; what is in the file is the workflow's to check."""
    import yaml

    try:
        config = yaml.safe_load(Path(configfile).read_text())
    except OSError as e:
        return f"cannot read {configfile} ({e.strerror or e})"
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        why = f"{e.problem} at line {mark.line + 1}, column {mark.column + 1}" if mark else str(e).splitlines()[0]
        return f"{configfile} is not valid YAML ({why})"
    except UnicodeDecodeError:
        return f"{configfile} is not a text file (no UTF-8)"
    if not isinstance(config, dict):
        return f"{configfile} holds no config (a YAML mapping of keys such as dataset, sources and paths)"
    return None


def refresh(args: argparse.Namespace) -> int:
    """Run the refresh's snakemake commands in order, then say what ran; `args.extra` goes to snakemake."""
    if problem := config_problem(args.configfile):
        print(f"shardsmith: refresh: {problem}", file=sys.stderr)
        return 2
    extra = args.extra
    before = set(snakemake_logs(args.directory))
    code = 0
    for cmd in refresh_commands(args.configfile, args.cores, extra=["--directory", args.directory, *extra]):
        code = subprocess.call(cmd)
        if code:
            break
    new = [log for log in snakemake_logs(args.directory) if log not in before]
    jobs = [job for log in new for job in jobs_run(log.read_text(errors="replace"))]
    if code:
        ran = f"; before that, {summarize(jobs).removeprefix('refresh: ')}" if jobs else ""
        print(f"refresh: FAILED: snakemake exited with {code} (its messages are above){ran}", file=sys.stderr)
    else:
        print(summarize(jobs), file=sys.stderr)
    return code
