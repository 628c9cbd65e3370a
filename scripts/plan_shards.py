"""Rule glue for plan_shards: logic in shardsmith.shards (and shardsmith.dedupe for scheduled refreshes)."""

import sys

sys.path.insert(0, f"{snakemake.scriptdir}/..")  # the shardsmith package beside scripts/

from pathlib import Path

from shardsmith.dedupe import PublishedManifestError, write_exclusions
from shardsmith.logs import run_job
from shardsmith.publish import PublishError
from shardsmith.s3 import S3Error, S3Settings
from shardsmith.shards import plan_shards


def main() -> None:
    paths = list(snakemake.input.samples)
    exclusions = list(snakemake.input.exclusions)
    dedupe = snakemake.params.dedupe
    if dedupe:
        out = Path(snakemake.output[0]) / "already_published.parquet"
        n = write_exclusions(paths, dedupe["dest"], dedupe["dataset"], out, s3=S3Settings(**dedupe["s3"]))
        exclusions.append(str(out))
        print(
            f"{n['samples']} samples: {n['kept_from_earlier_versions']} kept from {n['versions']} published versions, "
            f"{n['excluded']} new ones already published (url or image sha256) left out"
        )
    names = plan_shards(
        paths,
        part_ids=[Path(p).name.split(".")[0] for p in paths],
        dataset=snakemake.params.layout["dataset"],
        samples_per_shard=snakemake.params.layout["samples_per_shard"],
        out_dir=snakemake.output[0],
        exclusions=exclusions,
    )
    print(f"planned {len(names)} shards of at most {snakemake.params.layout['samples_per_shard']} samples")


run_job(snakemake.log[0], main, expected=(PublishedManifestError, PublishError, S3Error))
