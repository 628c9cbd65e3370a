"""Cluster resources checked before anything is submitted: a job's early-warning signal against its time limit.

The profile asks SLURM for SIGTERM some time before a long job's limit (`--signal=TERM@120` in `slurm_extra`),
so that it commits and ends cleanly. SLURM sends that signal up to 60 s earlier than asked; where the runtime
is not longer than both together, the signal comes as the job starts, and every attempt of every such job is
stopped before it has done anything.
"""

import re

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
