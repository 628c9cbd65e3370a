"""Rule glue for split_lookups: logic in shardsmith.shards.published; a slice of groups, a file each, committed
each (shardsmith.formats.slices)."""

import os

from shardsmith.core.logs import run_job
from shardsmith.formats.filelist import by_part
from shardsmith.formats.slices import run_slice
from shardsmith.shards.published import split_lookups


def main() -> None:
    samples, buckets = by_part(snakemake.input.samples), snakemake.params.buckets
    exclusions = list(snakemake.input.exclusions)  # the slice's folder, a table a group (with min_similarity)
    groups = {g["group"]: g for g in snakemake.params.groups}

    def make(group, folders):
        parts = groups[group]["parts"]
        excluded = [os.path.join(exclusions[0], f"{group}.parquet")] if exclusions else []
        n = split_lookups(
            [samples[p] for p in parts], groups[group]["first_part"], buckets, excluded, f"{folders[0]}/{group}.arrow"
        )
        print(f"group {group}: {n} samples of {len(parts)} parts split into {buckets} buckets to look up")

    run_slice(snakemake, list(groups), make, __file__)


run_job(snakemake.log[0], main)
