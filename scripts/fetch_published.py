"""Rule glue for fetch_published: logic in shardsmith.shards.published."""

from shardsmith.core.logs import run_job
from shardsmith.shards.dedupe import PublishedManifestError
from shardsmith.shards.published import fetch_published
from shardsmith.storage.s3 import S3Error, S3Settings
from shardsmith.storage.stores import PublishError


def main() -> None:
    d = snakemake.params.dedupe
    versions = fetch_published(d["dest"], d["dataset"], S3Settings(**d["s3"]), snakemake.output.manifests)
    print(f"{len(versions)} published versions: {', '.join(versions) or 'none yet'}")


run_job(snakemake.log[0], main, expected=(PublishedManifestError, PublishError, S3Error))
