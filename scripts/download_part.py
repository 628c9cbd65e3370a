"""Rule glue for download_part: logic in shardsmith.download."""

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
    )
    print(f"{snakemake.wildcards.part}: {len(status)} records, {(status['status'] == 'ok').sum()} fetched")
    print(status.loc[status["status"] != "ok", "reason"].value_counts().to_string())


run_job(snakemake.log[0], main)
