"""Rule glue for tabulate_dataset: logic in shardsmith.report.numbers."""

import json
from pathlib import Path

from shardsmith.core.logs import run_job
from shardsmith.formats.filelist import listed_files
from shardsmith.report import numbers as report


def main() -> None:
    stats = json.loads(Path(snakemake.input.stats).read_text())
    reasons = report.rejection_table(report.rejection_summary(snakemake.input.rejected), stats["input_records"])
    intro = (
        f"{stats['rejected']:,} of {stats['input_records']:,} input records rejected, by stage (in pipeline order) and "
        f"reason, with the first {report.EXAMPLES_PER_REASON} examples of each; every row is in rejected.parquet."
    )
    report.write_html(snakemake.output.rejections, report.html_table(reasons, "Rejections", intro))
    infos = [json.loads(Path(p).read_text()) for p in listed_files(snakemake.input.infos)]
    shards = report.shard_table(infos)
    intro = "Every published shard: samples, bytes and checksums of the tar file (also in wids-index.json)."
    report.write_html(snakemake.output.shards, report.html_table(shards, "Shards", intro))
    print(f"{len(reasons)} rejection reasons, {len(infos)} shards")


run_job(snakemake.log[0], main)
