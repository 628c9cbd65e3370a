"""Rule glue for split_keys: logic in shardsmith.shards.buckets; a slice of groups, a file each."""

from shardsmith.core.logs import run_job
from shardsmith.formats.filelist import by_part, slice_file
from shardsmith.shards.buckets import split_keys


def main() -> None:
    samples, buckets = by_part(snakemake.input.samples), snakemake.params.buckets
    for g in snakemake.params.groups:
        out = slice_file(snakemake.output[0], g["group"], ".arrow")
        n = split_keys([samples[p] for p in g["parts"]], g["first_part"], buckets, out)
        print(f"group {g['group']}: {n} keys of {len(g['parts'])} parts split into {buckets} buckets")


run_job(snakemake.log[0], main)
