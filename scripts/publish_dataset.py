"""Rule glue for publish_dataset: logic in shardsmith.publish.staged (the commit of a version uploaded by
upload_shards)."""

import json
from pathlib import Path

from shardsmith.core.atomic import atomic_write_text
from shardsmith.core.leftovers import use_scratch
from shardsmith.core.logs import run_job
from shardsmith.formats.filelist import listed_files
from shardsmith.publish.contents import PublishConflict
from shardsmith.publish.settings import PublishSettings
from shardsmith.publish.staged import commit_version
from shardsmith.storage.s3 import S3Error, S3Settings
from shardsmith.storage.stores import PublishError


def main() -> None:
    use_scratch(snakemake.params.scratch)
    plan = json.loads(Path(snakemake.input.plan).read_text())
    plan["table"] = json.loads(Path(snakemake.input.files).read_text())
    receipts = [json.loads(Path(p).read_text()) for p in listed_files(snakemake.input.receipts)]
    receipt = commit_version(
        plan,
        receipts,
        settings=PublishSettings.from_config(snakemake.params.settings),
        s3=S3Settings(**snakemake.params.s3),
    )
    atomic_write_text(snakemake.output[0], json.dumps(receipt, indent=1, sort_keys=True) + "\n")
    where = f"{plan['dest'].rstrip('/')}/{plan['dataset']}/{receipt['version']}"
    print(f"{'unchanged' if receipt['unchanged'] else 'published'}: {where} ({len(receipt['files'])} files)")


run_job(snakemake.log[0], main, expected=(PublishConflict, PublishError, S3Error))
