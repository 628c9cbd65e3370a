"""Rule glue for train_near_cells: logic in shardsmith.shards.neardup and shardsmith.shards.nearparts."""

from shardsmith.core.logs import run_job
from shardsmith.formats.filelist import listed_files
from shardsmith.shards.neardup import NearSettings, Published, no_published, train_near_cells
from shardsmith.shards.published import read_gone


def main() -> None:
    gone = read_gone(listed_files(snakemake.input.gone))
    published = Published(sorted(set(gone["version"])), no_published().old, gone)
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
