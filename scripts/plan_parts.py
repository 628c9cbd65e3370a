"""Rule glue for plan_parts: logic in shardsmith.sources."""

import sys

sys.path.insert(0, f"{snakemake.scriptdir}/..")  # the shardsmith package beside scripts/

from shardsmith.logs import run_job
from shardsmith.sources import plan_parts


def main() -> None:
    parts = plan_parts(snakemake.params.sources, snakemake.params.part_size, snakemake.output[0])
    print(f"planned {len(parts)} parts of at most {snakemake.params.part_size} records")


run_job(snakemake.log[0], main)
