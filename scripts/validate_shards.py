"""Rule glue for validate_shards: logic in shardsmith.validate."""

import sys

sys.path.insert(0, f"{snakemake.scriptdir}/..")  # the shardsmith package beside scripts/

from shardsmith.logs import run_job
from shardsmith.validate import validate_batch, write_json


def main() -> None:
    resize = snakemake.params.resize
    shards = list(zip(snakemake.input.tars, snakemake.input.plans, snakemake.input.infos, strict=True))
    batch = validate_batch(
        shards,
        resize["max_side"],
        resize["max_pixels"],
        snakemake.params.cache,
        snakemake.threads,
        snakemake.params.decode_per_shard,
    )
    write_json(snakemake.output[0], batch)
    for report in batch["shards"]:
        how = (
            "unchanged since an earlier validation"
            if report["reused"]
            else f"read with {report['loader']}, {report['decoded']} images decoded again"
        )
        print(f"{report['shard']}: {report['passed']} of {report['groups']} samples pass ({how})")
        for problem in report["problems"]:
            print(f"  problem: {problem}")


run_job(snakemake.log[0], main)
