"""Rule glue for decide_near_duplicates: logic in shardsmith.shards.neardup and shardsmith.shards.neardecide."""

from pathlib import Path

from shardsmith.core.logs import run_job
from shardsmith.formats.filelist import listed_files
from shardsmith.shards.neardup import NearSettings, decide_near_duplicates
from shardsmith.shards.nearparts import entries_samples


def main() -> None:
    samples = listed_files(snakemake.input.samples)
    counts = decide_near_duplicates(
        listed_files(snakemake.input.found),
        listed_files(snakemake.input.pending),
        listed_files(snakemake.input.messages),
        [Path(p).name.split(".")[0] for p in samples],
        NearSettings(**snakemake.params.near),
        sum(entries_samples(p) for p in listed_files(snakemake.input.entries)),
        Path(snakemake.output.table).parent,
        references=snakemake.params.references,
    )
    print(f"near-duplicates: {counts['near_duplicates']} samples in {counts['groups']} groups")


run_job(snakemake.log[0], main)
