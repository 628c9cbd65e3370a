"""Rule glue for split_published: logic in shardsmith.shards.published."""

from shardsmith.core.logs import run_job
from shardsmith.shards.published import split_published


def main() -> None:
    piece, pieces = int(snakemake.wildcards.group), snakemake.params.pieces
    n = split_published(snakemake.input.manifests, piece, pieces, snakemake.params.buckets, snakemake.output[0])
    print(f"piece {piece} of {pieces}: {n} published records split into {snakemake.params.buckets} buckets")


run_job(snakemake.log[0], main)
