"""Rule glue for split_near_entries: logic in shardsmith.shards.neardup and shardsmith.shards.nearparts."""

import numpy as np

from shardsmith.core.logs import run_job
from shardsmith.shards.buckets import dropped_ids
from shardsmith.shards.neardup import split_near_group


def main() -> None:
    published = list(snakemake.input.published)
    samples, first = list(snakemake.input.samples), snakemake.params.first_part
    # each part's rows the exact steps left out, as the group's ledger piece names them
    dropped = [dropped_ids([snakemake.input.dropped], first + i) & np.int64(0xFFFF_FFFF) for i in range(len(samples))]
    n = split_near_group(
        samples,
        first,
        dropped,
        published[0] if published else None,
        snakemake.input.cells,
        snakemake.output.entries,
        snakemake.output.homes,
        list(snakemake.input.embeddings),
    )
    print(f"{n} samples split into the near-duplicate buckets")


run_job(snakemake.log[0], main)
