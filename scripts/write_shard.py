"""Rule glue for write_shard: logic in shardsmith.shards (writing) and shardsmith.validate (re-reading)."""

import sys

sys.path.insert(0, f"{snakemake.scriptdir}/..")  # the shardsmith package beside scripts/

from pathlib import Path

from shardsmith.logs import run_job
from shardsmith.shards import write_shard
from shardsmith.validate import validate_shard, write_json


def main() -> None:
    parts = {Path(p).name.split(".")[0]: p for p in snakemake.input.parts}
    info = write_shard(snakemake.input.plan, parts, snakemake.output.tar, snakemake.output.info)
    print(f"{info['shard']}: {info['nsamples']} samples, {info['filesize']} bytes")
    resize = snakemake.params.resize
    report = validate_shard(
        snakemake.output.tar,
        snakemake.input.plan,
        resize["max_side"],
        resize["max_pixels"],
        snakemake.params.decode_per_shard,
    )
    write_json(snakemake.output.report, report)  # problems fail validate_dataset, with every shard's listed
    print(
        f"{report['shard']}: {report['passed']} of {report['groups']} samples pass {report['loader']}'s reader and "
        f"filter, {report['decoded']} images decoded again"
    )
    for problem in report["problems"]:
        print(f"  problem: {problem}")


run_job(snakemake.log[0], main)
