"""The one-screen summary of a build, and the OpenCLIP command that trains on it.

python -m shardsmith summary demo/results/demo
"""

import argparse
import json
import os
import shlex
import sys
import threading
from pathlib import Path

from shardsmith.formats.names import brace_pattern


def openclip_command(shard_dir: str, sizes: dict[str, int]) -> str:
    """The exact OpenCLIP training command for the shards listed in sizes.json. Two data loader workers, or one
    for a single shard: OpenCLIP asserts at least workers x GPUs shards. A batch of 256, or of the samples the
    worker with the fewest gets (each takes every `workers`-th shard) where that is less: OpenCLIP drops a
    worker's last partial batch, so with a larger batch on a small build its loader waits for ever."""
    pattern = f"{shard_dir.rstrip('/')}/{brace_pattern(list(sizes))}"
    quoted = shlex.quote(pattern) if "'" in pattern else f"'{pattern}'"  # a folder like /home/o'brien
    workers = max(1, min(2, len(sizes)))
    counts = [sizes[name] for name in sorted(sizes)]
    batch = max(1, min([256, *(sum(counts[w::workers]) for w in range(workers))]))
    return (
        "python -m open_clip_train.main --dataset-type webdataset "
        f"--train-data {quoted} --train-num-samples {sum(sizes.values())} "
        f"--workers {workers} --batch-size {batch} --model ViT-B-32 --epochs 32"
    )


def summary_text(out_dir: str) -> str:
    out = Path(out_dir)
    stats = json.loads((out / "stats.json").read_text())
    sizes = json.loads((out / "sizes.json").read_text())
    from shardsmith.report.numbers import filter_names, funnel_line

    build = out / "build.json"  # the config it was built with: the filters' order
    filters = filter_names(json.loads(build.read_text()).get("config")) if build.exists() else []
    lines = [
        f"dataset {stats['dataset']}: {stats['input_records']} input records -> "
        f"{stats['published']} published in {stats['shards']} shards, {stats['rejected']} rejected",
        f"  funnel: {funnel_line(stats, filters)}",
    ]
    for reason, n in sorted(stats["rejected_by_reason"].items(), key=lambda kv: -kv[1]):
        lines.append(f"  rejected {n:>8}  {reason}")
    lines.append(f"  ledger: {out / 'rejected.parquet'}")
    if (out / "embedding_stats.json").exists():
        emb = json.loads((out / "embedding_stats.json").read_text())
        sim = emb["similarity"]
        lines.append(
            f"  CLIP {emb['columns']['similarity']}: mean {sim.get('mean', float('nan')):.4f}, "
            f"median {sim.get('quantiles', {}).get('0.5', float('nan')):.4f} "
            f"({emb['provenance'].get('weights_statement', '')})"
        )
    if sizes:
        lines.append("train with:")
        lines.append("  " + openclip_command(str(out), sizes))
    return "\n".join(lines)


def partial_run(dag_settings) -> bool:
    """Whether a run built less than the whole dataset (`--until`, `--omit-from`, a rule or file as target): its
    end must not show the summary of an earlier build's files as if this run had made them."""
    if dag_settings is None:
        return False
    targets = set(dag_settings.targets) | set(dag_settings.target_jobs)
    return bool(dag_settings.until or dag_settings.omit_from or targets - {"all"})


def asks_for_stats(dag_settings, out_dir: str) -> bool:
    """Whether the run's targets name the build's stats.json: what it sums up is then this run's."""
    stats = os.path.abspath(os.path.join(out_dir, "stats.json"))
    return dag_settings is not None and any(
        isinstance(t, str) and os.path.abspath(t) == stats for t in dag_settings.targets
    )


def print_success(out_dir: str, published_dir: str | None = None, dag_settings=None) -> None:
    """The run's last screen (Snakemake `onsuccess`): the funnel, the rejections and the training command.
    `dag_settings` (Snakemake's `workflow.dag_settings`) tells a partial run, which shows nothing unless it was
    asked for the build's stats.json (then the summary of this build's files, not of a published version)."""
    if partial_run(dag_settings):
        if not asks_for_stats(dag_settings, out_dir):
            return
        published_dir = None
    if published_dir and Path(published_dir).is_file():  # the `latest` pointer (version: auto)
        published_dir = str(Path(published_dir).parent / Path(published_dir).read_text().strip())
    folder = published_dir if published_dir and (Path(published_dir) / "stats.json").exists() else out_dir
    if not (Path(folder) / "stats.json").exists():  # nothing built yet
        return
    try:
        text = summary_text(folder)
    except Exception as e:  # a summary must not turn a successful run into a traceback
        text = f"shardsmith: could not summarize {folder} ({e})"
    if (Path(folder) / "README.md").exists():
        text += f"\ndataset card: {Path(folder) / 'README.md'}"
    text += "\nreport: add --report report.html to this command to get the plots and tables"
    print(text, flush=True)


def stop_scheduler_timers() -> int:
    """Cancel the re-evaluation timers Snakemake's scheduler left behind (from onsuccess/onerror); how many.

    With its default --max-jobs-per-timespan (100/1s) the scheduler arms a 1-s threading.Timer after each
    pass. Timers are not daemon threads, so Python waits up to a second for the last one after the run
    has ended, on every run. When onsuccess/onerror run the scheduler is done and nothing waits on them.
    Found by the file of the timer's function (checked against Snakemake 9.27; the real fix, daemon
    timers, belongs in Snakemake). The test fails if a Snakemake release moves or renames it.
    """
    scheduler_code = os.path.join("snakemake", "scheduling", "")
    stopped = 0
    for thread in threading.enumerate():
        code = getattr(getattr(thread, "function", None), "__code__", None)
        if isinstance(thread, threading.Timer) and code is not None and scheduler_code in code.co_filename:
            thread.cancel()
            stopped += 1
    return stopped


# Which settings to look at when one stage rejected everything.
STAGE_HINTS = {
    "download": "check the sources' paths or URLs (and the s3 settings for s3:// sources)",
    "caption": "check captions.fields (which source field holds the caption) and captions.min_chars",
    "resize": "check resize.min_side and resize.max_decode_pixels, and that the inputs are images",
    "process": "check that sample keys are unique (key_column)",
    "shard": "check that sample keys are unique across sources",
    "filter": "check the filters (each one's column, op and value) against the manifests' columns",
    "embed": "check embed.min_similarity, and the model (random weights score nothing)",
    "select": "check the select rules (each one's column and threshold)",
    "dedupe": "check publish.dedupe, dedupe and evaluation_sets",
}
# Reasons whose setting is not their stage's usual one.
REASON_HINTS = {
    "caption/language": "check captions.languages and captions.min_language_score",
    "caption/too_few_words": "check captions.min_words",
    "resize/aspect_ratio": "check resize.max_aspect_ratio",
    "resize/bad_boxes": "check each source's blur_boxes field (a list of [x0, y0, x1, y1] boxes a record)",
    "dedupe/already_published": "every record is already in a published version (publish.dedupe)",
}
# Refusals of the download guard (shardsmith.download.fetch.netguard): the setting that lifts each.
GUARD_HINTS = {
    "blocked_address": "the network guard refused their addresses (loopback, private, link-local, ...); "
    "for a network of your own, list it in download.allow_networks (or its hosts in download.allow_hosts)",
    "outside_allowed_folders": "their local paths are outside the sources' own folders; "
    "list the folders they may read in download.allow_local_folders",
}
# Download reasons whose fix is time, not the sources: download.retry_reasons' defaults for http(s).
_RETRY = "`python -m shardsmith retry-failed CONFIG` then the same snakemake command fetches them again"
TRANSIENT_HINTS = {
    "deadline": f"download.part_deadline_s passed before they were fetched; raise it, or {_RETRY}",
    **dict.fromkeys(
        ("timeout", "connection_error", "dns_error", "server_error", "rate_limited", "truncated_download",
         "robots_unavailable", "tdmrep_unavailable"),
        f"the servers failed or did not answer (transient failures, see the timeouts in download); {_RETRY}",
    ),
}  # fmt: skip


def _main_logs(main_log: str | list[str] | None) -> list[str]:
    """Snakemake passes `onerror` a list of log files (one per logger), or one path."""
    logs = [main_log] if isinstance(main_log, (str, os.PathLike)) else list(main_log or [])
    return [str(p) for p in logs if p and Path(p).is_file()]


_RULE = "=" * 80  # the lines show-failed-logs puts above and below a job log it copies


def without_shown_logs(text: str) -> str:
    """Snakemake's log without the job logs that show-failed-logs (on in the cluster profile) copies into it.

    A job's own Snakemake wrote those, with job headers and Error blocks of their own about the same job, and
    a SLURM job's log holds the logs its inner Snakemake showed in turn: copies are dropped however nested."""
    kept: list[str] = []
    depth = 0
    lines = text.splitlines()
    for i, line in enumerate(lines):
        opens = line.startswith("Logfile ") and line.endswith(":") and i + 1 < len(lines) and lines[i + 1] == _RULE
        if opens:
            depth += 1
        elif line == _RULE and depth and not (i and lines[i - 1].startswith("Logfile ")):
            depth -= 1
        elif not depth:
            kept.append(line)
    return "\n".join(kept)


_SEE_LOGS = "For further error details see the cluster/cloud log and the log files of the involved rule(s)."


def failed_jobs(main_log: str | list[str] | None) -> list[dict]:
    """[{rule, log, wildcards, message}] of each `Error in rule` block of Snakemake's run log, one per job (its
    rule and own log file): a job retried is listed once, as its last attempt. `message` is what the executor
    said (an sbatch error, the SLURM state of a job it ended), all there is when the job never wrote its log."""
    jobs: dict[tuple[str, str], dict] = {}
    job: dict | None = None
    in_message = False

    def finish(job: dict) -> None:
        job["message"] = " ".join(job["message"].replace(_SEE_LOGS, "").split())
        key = (job["rule"], job["log"][0] if job["log"] else job["wildcards"])
        jobs.pop(key, None)
        jobs[key] = job

    text = without_shown_logs("\n".join(Path(p).read_text(errors="replace") for p in _main_logs(main_log)))
    for line in [*text.splitlines(), ""]:
        if line.startswith("Error in rule "):
            if job is not None:
                finish(job)
            job = {"rule": line.removeprefix("Error in rule ").rstrip(":"), "log": [], "wildcards": "", "message": ""}
            in_message = False
        elif job is None or line.startswith(_SEE_LOGS):
            continue
        elif line.startswith("    ") and not line.startswith("     "):
            key, _, value = line.strip().partition(": ")
            in_message = key == "message"
            if key == "log":
                job["log"] = value.removesuffix(" (check log file(s) for error details)").split(", ")
            elif key == "wildcards":
                job["wildcards"] = value
            elif in_message and value != "None":
                job["message"] = value
        elif in_message and line and not line.startswith(" "):
            job["message"] += " " + line  # the message's own line breaks (sbatch's error lines)
        elif not line.startswith(" "):  # the block ends: what follows is Snakemake's next message
            finish(job)
            job = None
        else:
            in_message = False
    return list(jobs.values())


def job_message(log_path: str, max_lines: int = 6) -> str:
    """The user-facing message a job left in its log: from the last `shardsmith:` line, without traceback."""
    try:
        lines = Path(log_path).read_text(errors="replace").splitlines()
    except OSError:
        return ""
    starts = [i for i, line in enumerate(lines) if line.startswith("shardsmith:")]
    if not starts:  # not one of ours: the last line of a traceback names the exception
        tail = [line for line in lines if line.strip()]
        return f"unexpected error: {tail[-1].strip()}" if tail else ""
    block = []
    for line in lines[starts[-1] :]:
        if line.startswith("Traceback"):
            break
        block.append(line)
    return "\n".join(block[:max_lines]).removeprefix("shardsmith: ")


def failure_text(main_log: str | list[str] | None, out_dir: str) -> str:
    """What failed, why (the job's own one-line message) and where its log is; plus the funnel if nothing passed."""
    jobs = failed_jobs(main_log)
    lines = []
    for job in jobs:
        where = f" ({job['wildcards']})" if job["wildcards"] else ""
        message = job_message(job["log"][0]) if job["log"] else ""  # the rule's own; others are the executor's
        if job["message"] and (not message or message.startswith("unexpected error: ")):
            message = job["message"] + (f" ({message})" if message else "")
        lines.append(f"shardsmith: {job['rule']}{where} failed" + (f": {message}" if message else ""))
        lines += [f"  log: {p}" for p in job["log"]]
    stats_path = Path(out_dir) / "stats.json"
    if jobs and stats_path.exists():
        stats = json.loads(stats_path.read_text())
        if stats["input_records"] and not stats["published"]:
            from shardsmith.storage.s3 import HINTS as S3_HINTS

            top = sorted(stats["rejected_by_reason"].items(), key=lambda kv: -kv[1])[:3]
            stage, _, code = top[0][0].partition("/") if top else ("", "", "")
            download = stage == "download"  # a filter's or rule's own name may read like a download reason
            hint = (
                REASON_HINTS.get(top[0][0] if top else "")
                or (download and (GUARD_HINTS.get(code) or TRANSIENT_HINTS.get(code)))
                or STAGE_HINTS.get(stage, "see rejected.parquet")
            )
            if code in S3_HINTS:  # credentials, endpoint, bucket: say which setting
                hint += f"; for s3:// sources, {S3_HINTS[code]}"
            reasons = ", ".join(f"{r} {n}" for r, n in top)
            lines.append(f"  all {stats['input_records']} input records were rejected ({reasons}): {hint}.")
            lines.append(f"  ledger: {Path(out_dir) / 'rejected.parquet'}")
    if jobs:
        where = ", ".join(_main_logs(main_log)) or "in .snakemake/log/"
        lines.append(f"  Snakemake's log: {where}; SHARDSMITH_DEBUG=1 puts tracebacks in the job logs.")
    return "\n".join(lines)


def print_failure(main_log: str | list[str] | None, out_dir: str) -> None:
    """Snakemake `onerror`: the failing jobs' own messages and logs, as the last thing on screen."""
    try:
        text = failure_text(main_log, out_dir)
    except Exception as e:  # the handler must never add a traceback of its own to a failed run
        text = f"shardsmith: could not summarize the failure ({e}); see the job logs named above."
    if text:
        print(text, file=sys.stderr, flush=True)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`shardsmith summary FOLDER`: a published version's folder (or the run's output folder)."""
    p.add_argument("folder", help="a built dataset's folder, e.g. demo/fast-storage/demo/v1")
    p.set_defaults(run=_summary_command)


def _summary_command(args: argparse.Namespace) -> int:
    folder = Path(args.folder)
    missing = next((n for n in ("stats.json", "sizes.json") if not (folder / n).is_file()), None)
    if missing:
        latest = folder / "latest"  # a publish destination's dataset folder: name the version to give
        named = latest.read_text().strip() if latest.is_file() else ""
        hint = f"; {latest} names {folder / named}" if named else ""
        message = f"shardsmith: summary: {folder} is not a built dataset's folder (it has no {missing}){hint}"
        print(message, file=sys.stderr)
        return 1
    try:
        text = summary_text(args.folder)
    except (ValueError, LookupError, TypeError, AttributeError) as e:  # another tool's stats.json, or a cut one
        why = f"no {e}" if isinstance(e, KeyError) else str(e).splitlines()[0]
        print(f"shardsmith: summary: {folder}: stats.json or sizes.json is not a build's ({why})", file=sys.stderr)
        return 1
    print(text)
    return 0
