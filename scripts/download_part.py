"""Rule glue for download_part: logic in shardsmith.download (records, raw cache) and shardsmith.fetch."""

import sys

sys.path.insert(0, f"{snakemake.scriptdir}/..")  # the shardsmith package beside scripts/

from shardsmith.download import download_part
from shardsmith.logs import run_job


def main() -> None:
    status = download_part(
        snakemake.input.records,
        out_tar=snakemake.output.tar,
        out_status=snakemake.output.status,
        source=snakemake.params.source,
        settings=snakemake.params.download,
        s3=snakemake.params.s3,
        retry_marker=snakemake.input.retry[0] if snakemake.input.retry else None,
    )
    failed = status[status["status"] != "ok"]
    if len(failed):
        print("failures by reason:\n" + failed["reason"].value_counts().to_string())


run_job(snakemake.log[0], main)
