"""Rule glue for write_energon_sqlite: logic in shardsmith.formats.energon (the format) and shardsmith.shards.write
(members)."""

from pathlib import Path

from shardsmith.core.leftovers import use_scratch
from shardsmith.core.logs import run_job
from shardsmith.formats.energon import EnergonError, write_sqlite
from shardsmith.formats.filelist import listed_files
from shardsmith.shards.write import read_members


def main() -> None:
    use_scratch(snakemake.params.scratch)  # TMPDIR, where SQLite spills while it builds the indexes
    tables = listed_files(snakemake.input.members)
    shards = (
        (Path(p).name.removesuffix(".members.parquet") + ".tar", read_members(p)) for p in tables
    )  # one at a time
    out_dir = Path(snakemake.output[0]).parent.parent
    samples = write_sqlite(out_dir, shards)
    print(f"{snakemake.output[0]}: {samples} samples in {len(tables)} shards")


run_job(snakemake.log[0], main, expected=(EnergonError,))
