"""Rule glue for collect_dropped: logic in shardsmith.shards.buckets."""

from shardsmith.core.logs import run_job
from shardsmith.formats.filelist import listed_files
from shardsmith.shards.buckets import group_drops


def main() -> None:
    counts = group_drops(
        listed_files(snakemake.input.drops),
        int(snakemake.wildcards.group),
        list(snakemake.input.samples),
        list(snakemake.params.parts),
        snakemake.params.first_part,
        snakemake.output[0],
    )
    for part, (n, dropped) in counts.items():
        print(f"{part}: {n - dropped} of {n} samples kept, {dropped} left out")


run_job(snakemake.log[0], main)
