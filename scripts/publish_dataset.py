"""Rule glue for publish_dataset: logic in shardsmith.publish.dataset."""

import json
from pathlib import Path

from shardsmith.core.atomic import atomic_write_text
from shardsmith.core.leftovers import use_scratch
from shardsmith.core.logs import run_job
from shardsmith.publish.contents import PublishConflict
from shardsmith.publish.dataset import publish
from shardsmith.publish.settings import PublishSettings
from shardsmith.storage.s3 import S3Error, S3Settings
from shardsmith.storage.stores import PublishError


def main() -> None:
    use_scratch(snakemake.params.scratch)
    t = snakemake.params.target
    infos = [json.loads(Path(p).read_text()) for p in snakemake.input.infos]
    receipt = publish(
        list(snakemake.input.files),
        t["dest"],
        t["dataset"],
        t["version"],
        settings=PublishSettings.from_config(snakemake.params.settings),
        s3=S3Settings(**snakemake.params.s3),
        known={i["shard"]: {"size": i["filesize"], "sha256": i["sha256"]} for i in infos},  # hashed by write_shard
        threads=snakemake.threads,
        names_from=snakemake.params.names_from,  # .nv-meta/ keeps its folder in the version
    )
    atomic_write_text(snakemake.output[0], json.dumps(receipt, indent=1, sort_keys=True) + "\n")
    where = f"{t['dest'].rstrip('/')}/{t['dataset']}/{receipt['version']}"
    print(f"{'unchanged' if receipt['unchanged'] else 'published'}: {where} ({len(receipt['files'])} files)")


run_job(snakemake.log[0], main, expected=(PublishConflict, PublishError, S3Error))
