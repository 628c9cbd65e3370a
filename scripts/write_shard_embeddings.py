"""Rule glue for write_shard_embeddings: logic in shardsmith.embed_stats."""

from shardsmith.embed_stats import write_shard_embeddings
from shardsmith.logs import run_job


def main() -> None:
    n = write_shard_embeddings(snakemake.input.plan, list(snakemake.input.embeddings), snakemake.output[0])
    print(f"{snakemake.output[0]}: {n} samples")


run_job(snakemake.log[0], main)
