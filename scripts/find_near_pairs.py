"""Rule glue for find_near_pairs: logic in shardsmith.shards.nearparts and shardsmith.shards.neardecide."""

from shardsmith.core.logs import run_job
from shardsmith.formats.filelist import listed_files
from shardsmith.shards.neardecide import write_pairs
from shardsmith.shards.nearparts import bucket_pairs


def main() -> None:
    near = snakemake.params.near
    pairs = bucket_pairs(
        listed_files(snakemake.input.entries),
        int(snakemake.wildcards.bucket),
        near["phash_max_distance"],
        near["embedding_min_similarity"],
        near["bin_size"],
    )
    write_pairs(snakemake.output.incoming, snakemake.output.outgoing, pairs, snakemake.params.partitions)
    print(f"bucket {snakemake.wildcards.bucket}: {len(pairs)} pairs")


run_job(snakemake.log[0], main)
