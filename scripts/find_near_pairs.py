"""Rule glue for find_near_pairs: logic in shardsmith.shards.nearparts and shardsmith.shards.neardecide."""

from pathlib import Path

from shardsmith.core.logs import run_job
from shardsmith.formats.filelist import listed_files
from shardsmith.shards.neardecide import write_pairs
from shardsmith.shards.nearparts import bucket_pairs


def main() -> None:
    near, out = snakemake.params.near, snakemake.output
    entries = listed_files(snakemake.input.entries)
    for folder in (out.incoming, out.outgoing):
        Path(folder).mkdir(parents=True, exist_ok=True)
    for bucket in snakemake.params.own:  # one bucket at a time: a job holds one bucket's entries
        pairs = bucket_pairs(
            entries, bucket, near["phash_max_distance"], near["embedding_min_similarity"], near["bin_size"]
        )
        name = f"{bucket:05d}.arrow"
        write_pairs(f"{out.incoming}/{name}", f"{out.outgoing}/{name}", pairs, snakemake.params.partitions)
        print(f"bucket {bucket:05d}: {len(pairs)} pairs")


run_job(snakemake.log[0], main)
