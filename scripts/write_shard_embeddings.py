"""Rule glue for write_shard_embeddings: logic in shardsmith.embed.stats."""

from shardsmith.core.logs import run_job
from shardsmith.embed.stats import write_shard_embeddings


def main() -> None:
    n = write_shard_embeddings(snakemake.input.plan, list(snakemake.input.embeddings), snakemake.output[0])
    print(f"{snakemake.output[0]}: {n} samples")


run_job(snakemake.log[0], main)
