"""Rule glue for train_near_cells: logic in shardsmith.shards.neardup and shardsmith.shards.nearparts."""

from shardsmith.core.logs import run_job
from shardsmith.formats.filelist import listed_files
from shardsmith.shards.neardup import NearSettings, train_near_cells


def main() -> None:
    layout = train_near_cells(
        listed_files(snakemake.input.samples),
        NearSettings(**snakemake.params.near),
        snakemake.params.samples,
        listed_files(snakemake.input.embeddings),
        snakemake.output.cells,
    )
    print(f"near-duplicate search: {layout.cells} cells in {layout.buckets} bucket jobs and partitions")


run_job(snakemake.log[0], main)
