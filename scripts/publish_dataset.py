"""Rule glue for publish_dataset: logic in shardsmith.publish."""

import sys

sys.path.insert(0, f"{snakemake.scriptdir}/..")  # the shardsmith package beside scripts/

import json

from shardsmith.logs import run_job
from shardsmith.publish import PublishConflict, publish_local
from shardsmith.tario import atomic_write_text


def main() -> None:
    p = snakemake.params.target
    receipt = publish_local(list(snakemake.input), p['dest'], p['dataset'], p['version'])
    receipt["dest"] = p['dest']
    atomic_write_text(snakemake.output[0], json.dumps(receipt, indent=1, sort_keys=True) + "\n")
    print(f"published {len(receipt['files'])} files to {p['dest']}/{p['dataset']}/{p['version']}; latest -> {p['version']}")


run_job(snakemake.log[0], main, expected=(PublishConflict,))
