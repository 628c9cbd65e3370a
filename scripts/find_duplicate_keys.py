"""Rule glue for find_duplicate_keys: logic in shardsmith.shards.buckets; a slice of buckets, a file each,
committed each (shardsmith.formats.slices)."""

from shardsmith.core.logs import run_job
from shardsmith.formats.filelist import listed_files
from shardsmith.formats.slices import run_slice
from shardsmith.shards.buckets import find_duplicate_keys


def main() -> None:
    tables = listed_files(snakemake.input.key_tables)

    def make(bucket, folders):
        out = f"{folders[0]}/{bucket}.arrow"
        n = find_duplicate_keys(tables, snakemake.input.excluded, int(bucket), snakemake.params.parts_per_group, out)
        print(f"bucket {bucket}: {n} samples left out (exclusions, repeated keys)")

    run_slice(snakemake, snakemake.params.own, make, __file__)


run_job(snakemake.log[0], main)
