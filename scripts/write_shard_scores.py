"""Rule glue for write_shard_scores: logic in shardsmith.embed.stats."""

from shardsmith.core.logs import run_job
from shardsmith.embed.stats import write_shard_scores


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
