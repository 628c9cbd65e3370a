"""Rule glue for write_shard_scores: logic in shardsmith.embed_stats."""

from shardsmith.embed_stats import write_shard_scores
from shardsmith.logs import run_job


def main() -> None:
    n = write_shard_scores(
        snakemake.input.plan,
        list(snakemake.input.scores),
        list(snakemake.input.embeddings),
        out_scores=snakemake.output.scores,
        out_sums=snakemake.output.sums,
    )
    print(f"{snakemake.output.scores}: {n} samples")


run_job(snakemake.log[0], main)
