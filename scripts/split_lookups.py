"""Rule glue for split_lookups: logic in shardsmith.shards.published; a slice of groups, a file each."""

import os

from shardsmith.core.logs import run_job
from shardsmith.formats.filelist import by_part, slice_file
from shardsmith.shards.published import split_lookups


def main() -> None:
    samples, buckets = by_part(snakemake.input.samples), snakemake.params.buckets
    exclusions = list(snakemake.input.exclusions)  # the slice's folder, a table a group (with min_similarity)
    for g in snakemake.params.groups:
        excluded = [os.path.join(exclusions[0], f"{g['group']}.parquet")] if exclusions else []
        out = slice_file(snakemake.output[0], g["group"], ".arrow")
        n = split_lookups([samples[p] for p in g["parts"]], g["first_part"], buckets, excluded, out)
        print(f"group {g['group']}: {n} samples of {len(g['parts'])} parts split into {buckets} buckets to look up")


run_job(snakemake.log[0], main)
