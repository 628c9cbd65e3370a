"""Rule glue for decide_selection: logic in shardsmith.embed.select."""

from pathlib import Path

from shardsmith.core.logs import run_job
from shardsmith.embed.select import SelectRule, decide_selection
from shardsmith.formats.filelist import listed_files


def main() -> None:
    summaries = {Path(p).name.split(".")[0]: p for p in listed_files(snakemake.input.summaries)}
    rules = [SelectRule(**r) for r in snakemake.params.rules]
    decided = decide_selection(dict(sorted(summaries.items())), rules, snakemake.params.model, snakemake.output[0])
    for rule in rules:
        d = decided["rules"][rule.name]
        print(
            f"{rule.name} ({rule.describe()}): {d['kept']} of {d['scored']} scored samples kept, from {d['threshold']}"
        )


run_job(snakemake.log[0], main)
