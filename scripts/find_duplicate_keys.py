"""Rule glue for find_duplicate_keys: logic in shardsmith.shards.buckets."""

from shardsmith.core.logs import run_job
from shardsmith.formats.filelist import listed_files
from shardsmith.shards.buckets import bucket_drops


def main() -> None:
    bucket = int(snakemake.wildcards.bucket)
    n = bucket_drops(
        listed_files(snakemake.input.key_tables),
        snakemake.input.excluded,
        bucket,
        snakemake.params.parts_per_group,
        snakemake.output[0],
    )
    print(f"bucket {bucket}: {n} samples left out (exclusions, repeated keys)")


run_job(snakemake.log[0], main)
