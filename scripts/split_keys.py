"""Rule glue for split_keys: logic in shardsmith.shards.buckets; a slice of groups, a file each, committed each
(shardsmith.formats.slices)."""

from shardsmith.core.logs import run_job
from shardsmith.formats.filelist import by_part
from shardsmith.formats.slices import run_slice
from shardsmith.shards.buckets import split_keys


def main() -> None:
    samples, buckets = by_part(snakemake.input.samples), snakemake.params.buckets
    groups = {g["group"]: g for g in snakemake.params.groups}

    def make(group, folders):
        parts = groups[group]["parts"]
        n = split_keys([samples[p] for p in parts], groups[group]["first_part"], buckets, f"{folders[0]}/{group}.arrow")
        print(f"group {group}: {n} keys of {len(parts)} parts split into {buckets} buckets")

    run_slice(snakemake, list(groups), make, __file__)


run_job(snakemake.log[0], main)
