"""Rule glue for index_shards: logic in shardsmith.formats.index."""

from pathlib import Path

from shardsmith.core.logs import run_job
from shardsmith.formats.filelist import listed_files
from shardsmith.formats.index import LedgerMismatch, build_index


def main() -> None:
    stats = build_index(
        snakemake.params.layout["dataset"],
        shard_infos=listed_files(snakemake.input.infos),
        manifest_pieces=listed_files(snakemake.input.manifests),
        status_paths=listed_files(snakemake.input.status),
        rejected_paths=listed_files(snakemake.input.rejected),
        out_dir=Path(snakemake.output.sizes).parent,
    )
    print(f"{stats['input_records']} input records = {stats['published']} published + {stats['rejected']} rejected")


run_job(snakemake.log[0], main, expected=(LedgerMismatch,))
