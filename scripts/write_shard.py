"""Rule glue for write_shard: logic in shardsmith.shards."""

import sys

sys.path.insert(0, f"{snakemake.scriptdir}/..")  # the shardsmith package beside scripts/

from pathlib import Path

from shardsmith.logs import run_job
from shardsmith.shards import write_shard


def main() -> None:
    parts = {Path(p).name.split(".")[0]: p for p in snakemake.input.parts}
    info = write_shard(snakemake.input.plan, parts, snakemake.output.tar, snakemake.output.info)
    print(f"{info['shard']}: {info['nsamples']} samples, {info['filesize']} bytes")


run_job(snakemake.log[0], main)
