"""Rule glue for collect_dropped: logic in shardsmith.shards.buckets; a slice of groups, a file each, committed
each (shardsmith.formats.slices)."""

from shardsmith.core.logs import run_job
from shardsmith.formats.filelist import by_part, listed_files
from shardsmith.formats.slices import run_slice
from shardsmith.shards.buckets import collect_dropped


def main() -> None:
    drops, samples = listed_files(snakemake.input.drops), by_part(snakemake.input.samples)
    groups = {g["group"]: g for g in snakemake.params.groups}

    def make(group, folders):
        g = groups[group]
        parts = list(g["parts"])
        counts = collect_dropped(
            drops, int(group), [samples[p] for p in parts], parts, g["first_part"], f"{folders[0]}/{group}.parquet"
        )
        for part, (n, dropped) in counts.items():
            print(f"{part}: {n - dropped} of {n} samples kept, {dropped} left out")

    run_slice(snakemake, list(groups), make, __file__)


run_job(snakemake.log[0], main)
