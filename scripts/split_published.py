"""Rule glue for split_published: logic in shardsmith.shards.published; a slice of groups (each its share of
the manifests), a file each, committed each (shardsmith.formats.slices)."""

from shardsmith.core.logs import run_job
from shardsmith.formats.slices import run_slice
from shardsmith.shards.published import split_published


def main() -> None:
    groups, buckets = snakemake.params.group_count, snakemake.params.buckets

    def make(group, folders):
        n = split_published(snakemake.input.manifests, int(group), groups, buckets, f"{folders[0]}/{group}.arrow")
        print(f"group {group}'s share of the manifests: {n} published records split into {buckets} buckets")

    run_slice(snakemake, [g["group"] for g in snakemake.params.groups], make, __file__)


run_job(snakemake.log[0], main)
