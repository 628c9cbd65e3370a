"""Rule glue for find_published: logic in shardsmith.shards.dedupe."""

from pathlib import Path

from shardsmith.core.logs import run_job
from shardsmith.shards.dedupe import PublishedManifestError, find_published
from shardsmith.storage.s3 import S3Error
from shardsmith.storage.stores import PublishError


def main() -> None:
    n = find_published(
        list(snakemake.input.samples),
        list(snakemake.input.exclusions),
        snakemake.params.dedupe,
        Path(snakemake.output.exclusions).parent,
        near=snakemake.params.near,
    )
    print(f"{n['versions']} published versions; {n['excluded']} new records already published (url or sha256)")


run_job(snakemake.log[0], main, expected=(PublishedManifestError, PublishError, S3Error))
