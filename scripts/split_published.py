"""Rule glue for split_published: logic in shardsmith.shards.published; a slice of groups (pieces of the
manifests), a file each, committed each (shardsmith.formats.slices)."""

from shardsmith.core.logs import run_job
from shardsmith.formats.slices import run_slice
from shardsmith.shards.published import split_published


def main() -> None:
    pieces, buckets = snakemake.params.pieces, snakemake.params.buckets

    def make(group, folders):
        n = split_published(snakemake.input.manifests, int(group), pieces, buckets, f"{folders[0]}/{group}.arrow")
        print(f"piece {int(group)} of {pieces}: {n} published records split into {buckets} buckets")

    run_slice(snakemake, [g["group"] for g in snakemake.params.groups], make, __file__)


run_job(snakemake.log[0], main)
