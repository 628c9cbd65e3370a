"""Rule glue for split_exclusions: logic in shardsmith.shards.buckets."""

from shardsmith.core.logs import run_job
from shardsmith.formats.filelist import listed_files
from shardsmith.shards.buckets import split_exclusions


def main() -> None:
    n = split_exclusions(
        listed_files(snakemake.input.tables), snakemake.params.buckets, snakemake.output[0], snakemake.params.scratch
    )
    print(f"{n} exclusion rows split into {snakemake.params.buckets} buckets")


run_job(snakemake.log[0], main)
