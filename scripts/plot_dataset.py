"""Rule glue for plot_dataset: logic in shardsmith.report.plots and shardsmith.report.numbers."""

import json
from pathlib import Path

from shardsmith.core.logs import run_job
from shardsmith.report import numbers as report
from shardsmith.report import plots

MANIFEST_COLUMNS = ["source", "width_before", "height_before", "width", "height", "bytes", "caption_length"]


def main() -> None:
    stats = json.loads(Path(snakemake.input.stats).read_text())
    summary = report.rejection_summary(snakemake.input.rejected)
    plots.plot_funnel(stats, summary, snakemake.output.funnel, report.filter_names(snakemake.config))
    manifest, total = report.read_columns(snakemake.input.manifest, MANIFEST_COLUMNS)
    plots.plot_images(manifest, snakemake.output.images, max_side=snakemake.params.max_side, total=total)
    plots.plot_captions(manifest, snakemake.output.captions, max_chars=snakemake.params.max_chars, total=total)
    print(f"plotted {total} samples{f' (even sample of {len(manifest)})' if total > len(manifest) else ''}")


run_job(snakemake.log[0], main)
