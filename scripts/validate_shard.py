"""Rule glue for validate_shard: logic in shardsmith.validate."""

import sys

sys.path.insert(0, f"{snakemake.scriptdir}/..")  # the shardsmith package beside scripts/

from shardsmith.logs import run_job
from shardsmith.validate import validate_shard, write_json


def main() -> None:
    resize = snakemake.params.resize
    report = validate_shard(snakemake.input.tar, snakemake.input.plan, resize["max_side"], resize["max_pixels"])
    write_json(snakemake.output[0], report)
    print(f"{report['shard']}: {report['passed']} of {report['groups']} samples pass {report['loader']}")
    for problem in report["problems"]:
        print(f"  problem: {problem}")


run_job(snakemake.log[0], main)
