"""Rule glue for plan_shards: logic in shardsmith.shards."""

import sys

sys.path.insert(0, f"{snakemake.scriptdir}/..")  # the shardsmith package beside scripts/

from pathlib import Path

from shardsmith.logs import run_job
from shardsmith.shards import plan_shards


def main() -> None:
    paths = list(snakemake.input.samples)
    names = plan_shards(
        paths,
        part_ids=[Path(p).name.split(".")[0] for p in paths],
        dataset=snakemake.params.layout["dataset"],
        samples_per_shard=snakemake.params.layout["samples_per_shard"],
        out_dir=snakemake.output[0],
        exclusions=list(snakemake.input.exclusions),
    )
    print(f"planned {len(names)} shards of at most {snakemake.params.layout['samples_per_shard']} samples")


run_job(snakemake.log[0], main)
