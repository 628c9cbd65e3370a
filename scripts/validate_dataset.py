"""Rule glue for validate_dataset: logic in shardsmith.shards.validate."""

from pathlib import Path

from shardsmith.core.logs import run_job
from shardsmith.formats.filelist import listed_files
from shardsmith.shards.validate import ValidationFailed, check_dataset, planned_keys, write_json


def main() -> None:
    near = snakemake.input.get("near_dropped")
    summary = check_dataset(
        listed_files(snakemake.input.reports),
        snakemake.input.sizes,
        None,  # keys checked by bucket: the planned keys' digests against the shards'
        min_shards=snakemake.params.min_shards,
        planned=planned_keys(listed_files(snakemake.input.key_drops), near),
        tmp=str(Path(snakemake.output[0]).parent),  # beside the outputs, not in a node's small /tmp
        energon_dir=str(Path(snakemake.input.energon_info).parent.parent),  # the folder .nv-meta/ is in
        energon_sqlite=bool(snakemake.input.energon_sqlite),  # written where loaders.energon_sqlite asks for it
    )
    write_json(snakemake.output[0], summary)
    print(f"valid: {summary['samples']} samples in {summary['shards']} shards, read with {summary['loader']}")


run_job(snakemake.log[0], main, expected=(ValidationFailed,))
