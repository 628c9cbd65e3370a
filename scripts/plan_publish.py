"""Rule glue for plan_publish: logic in shardsmith.publish.staged."""

import json
from pathlib import Path

from shardsmith.core.atomic import atomic_write_text
from shardsmith.core.leftovers import use_scratch
from shardsmith.core.logs import run_job
from shardsmith.formats.filelist import listed_files
from shardsmith.formats.names import number
from shardsmith.publish.contents import PublishConflict
from shardsmith.publish.settings import PublishSettings
from shardsmith.publish.staged import plan_version, recorded_hashes
from shardsmith.storage.s3 import S3Error, S3Settings
from shardsmith.storage.stores import PublishError


def main() -> None:
    use_scratch(snakemake.params.scratch)
    t, out = snakemake.params.target, snakemake.output
    infos = [json.loads(Path(p).read_text()) for p in listed_files(snakemake.input.infos)]
    plan, batches = plan_version(
        listed_files(snakemake.input.files),  # every shard's files through their lists
        t["dest"],
        t["dataset"],
        t["version"],
        snakemake.params.batches,
        settings=PublishSettings.from_config(snakemake.params.settings),
        s3=S3Settings(**snakemake.params.s3),
        known=recorded_hashes(infos),  # hashed by write_shard
        names_from=snakemake.params.names_from,  # .nv-meta/ keeps its folder in the version
        threads=snakemake.threads,
    )
    Path(out.batches).mkdir(parents=True, exist_ok=True)
    after = None
    for i, batch in enumerate(batches):
        name = f"{number(i, len(batches))}.json"
        atomic_write_text(Path(out.batches, name), json.dumps({"after": after, "files": batch}) + "\n")
        after = max(batch, default=after)
    atomic_write_text(out.files, json.dumps(plan.pop("table"), sort_keys=True) + "\n")
    atomic_write_text(out.plan, json.dumps(plan, indent=1, sort_keys=True) + "\n")
    where = f"{t['dest'].rstrip('/')}/{t['dataset']}/{plan['version']}"
    if plan["unchanged"]:
        print(f"unchanged: {where} already holds this content; nothing to upload")
    else:
        print(f"{where}: {sum(map(len, batches))} files in {len(batches)} upload batches")


run_job(snakemake.log[0], main, expected=(PublishConflict, PublishError, S3Error))
