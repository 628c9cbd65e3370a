"""Cluster checks made before anything is submitted: a job's early-warning signal against its time limit, and
no job of an earlier run still queued or running in the same folder.

The profile asks SLURM for SIGTERM some time before a long job's limit (`--signal=TERM@120` in `slurm_extra`),
so that it commits and ends cleanly. SLURM sends that signal up to 60 s earlier than asked; where the runtime
is not longer than both together, the signal comes as the job starts, and every attempt of every such job is
stopped before it has done anything.
"""

import os
import re
import subprocess

SLURM_EARLY_S = 60  # SLURM's signal may come this much earlier than asked (sbatch --signal)
_SIGNAL = re.compile(r"--signal[= ]\S*?@(\d+)")  # sbatch --signal=[{R|B}:]<sig_num>[@sig_time]


def signal_lead_problems(by_rule: dict[str, dict], default_runtime: object) -> list[str]:
    """One message per rule whose `slurm_extra` asks for a signal no earlier than its runtime allows.

    `by_rule`: each rule's set-resources as given (numbers, or strings as Snakemake keeps them); runtime in
    minutes, the rule's own or else `default_runtime`. A value that is an expression is not judged."""
    problems = []
    for rule, resources in by_rule.items():
        signal = _SIGNAL.search(str(resources.get("slurm_extra") or ""))
        runtime = resources.get("runtime", default_runtime)
        if not signal or isinstance(runtime, bool) or not isinstance(runtime, (int, float)):
            continue
        lead_s = int(signal.group(1))
        if runtime * 60 <= lead_s + SLURM_EARLY_S:
            problems.append(
                f"{rule}: runtime {runtime:g} min leaves no time before its --signal=...@{lead_s} "
                f"(SLURM sends it up to {SLURM_EARLY_S} s early), so SLURM would stop every attempt as it starts; "
                f"set runtime above {(lead_s + SLURM_EARLY_S) / 60:g} min, or a shorter signal lead in slurm_extra"
            )
    return problems


def check_signal_leads(resource_settings) -> None:
    """Exit with one line per problem (signal_lead_problems) for Snakemake's resource settings (the profile's
    set-resources and default-resources, or the command line's)."""

    def raw(value):  # Snakemake keeps each value as a Resource, its given value in `raw`
        return getattr(value, "raw", value)

    by_rule = {
        rule: {name: raw(value) for name, value in dict(resources).items()}
        for rule, resources in dict(resource_settings.overwrite_resources or {}).items()
    }
    defaults = resource_settings.default_resources
    default_runtime = raw(dict(defaults or {}).get("runtime")) if defaults is not None else None
    problems = signal_lead_problems(by_rule, default_runtime)
    if problems:
        raise SystemExit("\n".join(f"shardsmith: cluster profile: {p}" for p in problems))


# The slurm executor names every job it submits after its run's UUID (sbatch --job-name)
_RUN_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def jobs_in_folder(folder: str | os.PathLike) -> list[str]:
    """Ids of this user's SLURM jobs that a snakemake run submitted (named after its run's UUID), queued or running
    with `folder` as their working directory (squeue's WorkDir); none where squeue cannot be asked. The job this
    process runs in is not one: snakemake itself may run as a batch job or in an allocation from that folder."""
    try:
        proc = subprocess.run(["squeue", "--me", "-h", "-o", "%i|%j|%Z"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if proc.returncode:
        return []
    here, own = os.path.realpath(folder), os.environ.get("SLURM_JOB_ID")
    rows = (line.split("|", 2) for line in proc.stdout.splitlines() if line.count("|") >= 2)
    return [
        job_id
        for job_id, name, workdir in rows
        if job_id != own and _RUN_UUID.fullmatch(name) and os.path.realpath(workdir.strip()) == here
    ]


def check_no_earlier_jobs(folder: str | os.PathLike, executor: str | None) -> None:
    """On SLURM, exit with one line if jobs of an earlier run of this folder are still queued or running.

    The snakemake process that submitted them was killed (or lost with its login session) and they went on; a
    new run would submit the same jobs beside them, both writing the same files, and this run's start would
    remove the temporary files they are writing as a killed run's leftovers."""
    if executor != "slurm":
        return
    ids = jobs_in_folder(folder)
    if ids:
        shown = " ".join(ids[:20]) + (" ..." if len(ids) > 20 else "")
        raise SystemExit(
            f"shardsmith: {len(ids)} SLURM job(s) of an earlier run in {os.path.realpath(folder)} are still queued "
            f"or running ({shown}), writing the files this run would: cancel them (scancel {shown}) or wait "
            "until squeue no longer shows them, then run again"
        )
