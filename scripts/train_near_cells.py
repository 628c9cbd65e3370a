"""Rule glue for train_near_cells: logic in shardsmith.shards.neardup and shardsmith.shards.nearparts."""

from shardsmith.core.logs import run_job
from shardsmith.shards.neardup import NearSettings, no_published, read_published, train_near_cells


def main() -> None:
    published = read_published(*snakemake.input.published) if snakemake.input.published else no_published()
    layout = train_near_cells(
        list(snakemake.input.samples),
        NearSettings(**snakemake.params.near),
        snakemake.params.samples,
        published,
        list(snakemake.input.embeddings),
        snakemake.output.cells,
        snakemake.output.entries,
        snakemake.output.homes,
    )
    print(f"near-duplicate search: {layout.cells} cells in {layout.buckets} bucket jobs and partitions")


run_job(snakemake.log[0], main)
