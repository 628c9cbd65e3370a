"""Rule glue for collect_dropped: logic in shardsmith.shards.buckets; a slice of groups, a file each."""

from shardsmith.core.logs import run_job
from shardsmith.formats.filelist import by_part, listed_files, slice_file
from shardsmith.shards.buckets import group_drops


def main() -> None:
    drops, samples = listed_files(snakemake.input.drops), by_part(snakemake.input.samples)
    for g in snakemake.params.groups:
        counts = group_drops(
            drops,
            int(g["group"]),
            [samples[p] for p in g["parts"]],
            list(g["parts"]),
            g["first_part"],
            slice_file(snakemake.output[0], g["group"], ".parquet"),
        )
        for part, (n, dropped) in counts.items():
            print(f"{part}: {n - dropped} of {n} samples kept, {dropped} left out")


run_job(snakemake.log[0], main)
