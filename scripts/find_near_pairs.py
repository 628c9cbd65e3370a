"""Rule glue for find_near_pairs: logic in shardsmith.shards.neardup; a slice of buckets, a file each in each
output, committed each (shardsmith.formats.slices)."""

from shardsmith.core.logs import run_job
from shardsmith.formats.filelist import listed_files
from shardsmith.formats.slices import run_slice
from shardsmith.shards.neardup import NearSettings, find_near_pairs


def main() -> None:
    near = NearSettings(**snakemake.params.near)
    entries = listed_files(snakemake.input.entries)

    def make(bucket, folders):  # one bucket at a time: a job holds one bucket's entries
        incoming, outgoing = (f"{f}/{bucket}.arrow" for f in folders)
        n = find_near_pairs(entries, int(bucket), near, incoming, outgoing, snakemake.params.partitions)
        print(f"bucket {bucket}: {n} pairs")

    run_slice(snakemake, snakemake.params.own, make, __file__)


run_job(snakemake.log[0], main)
