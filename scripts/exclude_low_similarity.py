"""Rule glue for exclude_low_similarity: logic in shardsmith.embed.stats."""

from shardsmith.core.logs import run_job
from shardsmith.embed.stats import write_exclusions


def main() -> None:
    n = write_exclusions(
        list(snakemake.input), snakemake.params.model, snakemake.params.min_similarity, snakemake.output[0]
    )
    print(f"{n} samples below min_similarity {snakemake.params.min_similarity}")


run_job(snakemake.log[0], main)
