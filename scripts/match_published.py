"""Rule glue for match_published: logic in shardsmith.shards.published; a slice of buckets, a file each in each
output, committed each (shardsmith.formats.slices)."""

from shardsmith.core.logs import run_job
from shardsmith.formats.filelist import listed_files
from shardsmith.formats.slices import run_slice
from shardsmith.shards.published import match_published


def main() -> None:
    params = snakemake.params
    records, lookups = listed_files(snakemake.input.records), listed_files(snakemake.input.lookups)

    def make(bucket, folders):
        matches, gone = (f"{f}/{bucket}.arrow" for f in folders)
        n = match_published(
            records, lookups, int(bucket), params.groups, params.parts_per_group, matches, gone, near=params.near
        )
        print(
            f"bucket {bucket}: {n['published']} published lookups, {n['samples']} of samples, "
            f"{n['matched']} matched; {n['gone']} published records gone from the build"
        )

    run_slice(snakemake, params.own, make, __file__)


run_job(snakemake.log[0], main)
