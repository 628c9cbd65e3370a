"""Rule glue for plot_embeddings: logic in shardsmith.report.plots and shardsmith.report.numbers."""

import json
from pathlib import Path

import pyarrow.parquet as pq

from shardsmith.core.errors import ConfigError
from shardsmith.core.logs import run_job
from shardsmith.formats.filelist import listed_files
from shardsmith.report import numbers as report
from shardsmith.report import plots


def main() -> None:
    stats = json.loads(Path(snakemake.input.stats).read_text())
    tables = listed_files(snakemake.input.scores)
    if not tables:
        raise ConfigError("plot_embeddings: no score tables; the embed stage (embed.enabled) scores each part first")
    names = pq.ParquetFile(tables[0]).schema_arrow.names
    named = stats.get("columns") or {}
    sim = named.get("similarity") if named.get("similarity") in names else report.similarity_column(names)
    norms = [c for c in (named.get("image_norm"), named.get("text_norm")) if c in names] or report.norm_columns(names)
    scores, total = report.read_columns(tables, [sim, *norms])
    selection = (
        json.loads(Path(snakemake.input.selection[0]).read_text())["summary"] if snakemake.input.selection else None
    )
    plots.plot_embeddings(scores, stats, snakemake.output[0], total=total, selection=selection)
    print(f"plotted CLIP scores of {total} samples from {len(tables)} tables")


run_job(snakemake.log[0], main)
