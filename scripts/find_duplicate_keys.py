"""Rule glue for find_duplicate_keys: logic in shardsmith.shards.buckets."""

from pathlib import Path

from shardsmith.core.logs import run_job
from shardsmith.formats.filelist import listed_files
from shardsmith.shards.buckets import bucket_drops


def main() -> None:
    tables, out = listed_files(snakemake.input.key_tables), Path(snakemake.output[0])
    out.mkdir(parents=True, exist_ok=True)
    for bucket in snakemake.params.own:  # one bucket at a time
        n = bucket_drops(
            tables, snakemake.input.excluded, bucket, snakemake.params.parts_per_group, out / f"{bucket:05d}.arrow"
        )
        print(f"bucket {bucket:05d}: {n} samples left out (exclusions, repeated keys)")


run_job(snakemake.log[0], main)
