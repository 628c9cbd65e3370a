"""Rule glue for dedupe_published: logic in shardsmith.dedupe."""

import sys

sys.path.insert(0, f"{snakemake.scriptdir}/..")  # the shardsmith package beside scripts/

from shardsmith.dedupe import PublishedManifestError, write_exclusions
from shardsmith.logs import run_job
from shardsmith.publish import PublishError
from shardsmith.s3 import S3Error, S3Settings


def main() -> None:
    n = write_exclusions(
        list(snakemake.input.samples),
        snakemake.params.published["dest"],
        snakemake.params.published["dataset"],
        snakemake.output[0],
        s3=S3Settings(**snakemake.params.s3),
    )
    print(
        f"{n['samples']} samples: {n['kept_from_earlier_versions']} kept from {n['versions']} published versions, "
        f"{n['excluded']} new ones already published (url or image sha256) left out"
    )


run_job(snakemake.log[0], main, expected=(PublishedManifestError, PublishError, S3Error))
