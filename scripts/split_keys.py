"""Rule glue for split_keys: logic in shardsmith.shards.buckets."""

from shardsmith.core.logs import run_job
from shardsmith.shards.buckets import split_keys


def main() -> None:
    samples = list(snakemake.input.samples)
    n = split_keys(samples, snakemake.params.first_part, snakemake.params.buckets, snakemake.output[0])
    print(f"{n} keys of {len(samples)} parts split into {snakemake.params.buckets} buckets")


run_job(snakemake.log[0], main)
