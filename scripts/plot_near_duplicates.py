"""Rule glue for plot_near_duplicates: logic in shardsmith.report.near."""

import json
from pathlib import Path

import pandas as pd

from shardsmith.core.logs import run_job
from shardsmith.formats.filelist import listed_files
from shardsmith.report.near import image_places, pick_examples, plot_distances, sheet


def main() -> None:
    table, counts = snakemake.input.near
    near = pd.read_parquet(table)
    settings = json.loads(Path(counts).read_text())["settings"]
    plot_distances(near, settings, snakemake.output.distances)
    part = lambda p: Path(p).name.split(".")[0]  # noqa: E731
    samples = {part(p): p for p in listed_files(snakemake.input.samples)}
    tars = {part(p): p for p in listed_files(snakemake.input.tars)}
    examples = pick_examples(near)
    sheet(examples, image_places(examples, samples, tars), snakemake.output.pairs)
    print(f"{len(near)} near-duplicates; {len(examples)} example pairs on the sheet")


run_job(snakemake.log[0], main)
