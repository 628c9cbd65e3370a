"""Rule glue for split_near_entries: logic in shardsmith.shards.neardup and shardsmith.shards.nearparts."""

from shardsmith.core.logs import run_job
from shardsmith.shards.neardup import split_near_group


def main() -> None:
    published = list(snakemake.input.published)
    n = split_near_group(
        list(snakemake.input.samples),
        snakemake.params.first_part,
        snakemake.input.dropped,
        published[0] if published else None,
        snakemake.input.cells,
        snakemake.output[0],
        list(snakemake.input.embeddings),
    )
    print(f"{n} samples split into the near-duplicate buckets")


run_job(snakemake.log[0], main)
