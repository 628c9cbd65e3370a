"""Rule glue for plan_shards: logic in shardsmith.shards.plan (the order: records already published, then
near-duplicates, then the shards), shardsmith.shards.dedupe and shardsmith.shards.neardup."""

from shardsmith.core.logs import run_job
from shardsmith.shards.dedupe import PublishedManifestError
from shardsmith.shards.neardup import NearSettings
from shardsmith.shards.plan import plan_dataset
from shardsmith.storage.s3 import S3Error
from shardsmith.storage.stores import PublishError


def main() -> None:
    layout = snakemake.params.layout
    names = plan_dataset(
        list(snakemake.input.samples),
        snakemake.output[0],
        dataset=layout["dataset"],
        samples_per_shard=layout["samples_per_shard"],
        exclusions=list(snakemake.input.exclusions),
        dedupe=snakemake.params.dedupe,
        near=NearSettings(**snakemake.params.near),
        embeddings=list(snakemake.input.embeddings),
        scratch=snakemake.params.scratch,
    )
    print(f"planned {len(names)} shards of at most {layout['samples_per_shard']} samples")


run_job(snakemake.log[0], main, expected=(PublishedManifestError, PublishError, S3Error))
