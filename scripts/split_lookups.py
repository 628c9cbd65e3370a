"""Rule glue for split_lookups: logic in shardsmith.shards.published."""

from shardsmith.core.logs import run_job
from shardsmith.shards.published import split_lookups


def main() -> None:
    samples = list(snakemake.input.samples)
    n = split_lookups(
        samples, snakemake.params.first_part, snakemake.params.buckets, list(snakemake.input.exclusions),
        snakemake.output[0],
    )  # fmt: skip
    print(f"{n} samples of {len(samples)} parts split into {snakemake.params.buckets} buckets to look up")


run_job(snakemake.log[0], main)
