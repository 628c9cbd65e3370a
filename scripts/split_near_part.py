"""Rule glue for split_near_part: logic in shardsmith.shards.neardup and shardsmith.shards.nearparts."""

from shardsmith.core.logs import run_job
from shardsmith.shards.neardup import split_near_part_job


def main() -> None:
    published = list(snakemake.input.published)
    embeddings = list(snakemake.input.embeddings)
    n = split_near_part_job(
        snakemake.input.samples,
        snakemake.params.part_index,
        list(snakemake.input.exclusions),
        published[0] if published else None,
        snakemake.input.cells,
        snakemake.output[0],
        embeddings[0] if embeddings else None,
    )
    print(f"{n} samples split into the near-duplicate buckets")


run_job(snakemake.log[0], main)
