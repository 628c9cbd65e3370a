"""Rule glue for split_near_entries: logic in shardsmith.shards.neardup and shardsmith.shards.nearparts."""

import numpy as np
import pandas as pd

from shardsmith.core.logs import run_job
from shardsmith.shards.buckets import dropped_ids
from shardsmith.shards.neardup import split_near_group


def main() -> None:
    published, gone = list(snakemake.input.published), list(snakemake.input.gone)
    samples, first = list(snakemake.input.samples), snakemake.params.first_part
    # each part's rows the exact steps left out, as the group's ledger piece names them
    dropped = [dropped_ids([snakemake.input.dropped], first + i) & np.int64(0xFFFF_FFFF) for i in range(len(samples))]
    gone_here = pd.read_parquet(gone[0]) if gone else None
    n = split_near_group(
        samples,
        first,
        dropped,
        published[0] if published else None,
        snakemake.input.cells,
        snakemake.output.entries,
        snakemake.output.homes,
        list(snakemake.input.embeddings),
        gone_here,
        snakemake.params.parts,
    )
    extra = f", and {len(gone_here)} published ones no longer in the build" if gone_here is not None else ""
    print(f"{n} samples split into the near-duplicate buckets{extra}")


run_job(snakemake.log[0], main)
