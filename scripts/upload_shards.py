"""Rule glue for upload_shards: logic in shardsmith.publish.staged."""

import json
from pathlib import Path

from shardsmith.core.atomic import atomic_write_text
from shardsmith.core.leftovers import use_scratch
from shardsmith.core.logs import run_job
from shardsmith.publish.contents import PublishConflict
from shardsmith.publish.settings import PublishSettings
from shardsmith.publish.staged import upload_batch
from shardsmith.storage.s3 import S3Error, S3Settings
from shardsmith.storage.stores import PublishError


def main() -> None:
    use_scratch(snakemake.params.scratch)
    plan = json.loads(Path(snakemake.input.plan).read_text())
    batch = json.loads(Path(snakemake.input.batches, f"{snakemake.wildcards.batch}.json").read_text())
    receipt = upload_batch(
        plan,
        batch["files"],
        batch["after"],
        settings=PublishSettings.from_config(snakemake.params.settings),
        s3=S3Settings(**snakemake.params.s3),
        threads=snakemake.threads,
    )
    atomic_write_text(snakemake.output[0], json.dumps(receipt, sort_keys=True) + "\n")
    print(
        f"batch {snakemake.wildcards.batch}: {len(receipt['files'])} files of {plan['version']} in place and verified"
    )


run_job(snakemake.log[0], main, expected=(PublishConflict, PublishError, S3Error))
