"""Rule glue for process_part: logic in shardsmith.process (resize, captions)."""

import sys

sys.path.insert(0, f"{snakemake.scriptdir}/..")  # the shardsmith package beside scripts/

from shardsmith.captions import CaptionSettings
from shardsmith.logs import run_job
from shardsmith.process import process_part
from shardsmith.resize import ResizeSettings


def main() -> None:
    kept, rejected = process_part(
        snakemake.input.tar,
        snakemake.input.status,
        out_tar=snakemake.output.tar,
        out_samples=snakemake.output.samples,
        out_rejected=snakemake.output.rejected,
        resize=ResizeSettings(**snakemake.params.resize),
        captions=CaptionSettings(**snakemake.params.captions),
        threads=snakemake.threads,
    )
    print(f"{snakemake.wildcards.part}: {kept} samples, {rejected} rejected")


run_job(snakemake.log[0], main)
