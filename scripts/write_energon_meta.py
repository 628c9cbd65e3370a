"""Rule glue for write_energon_meta: logic in shardsmith.formats.energon (the format) and shardsmith.shards.plan
(members)."""

from pathlib import Path

from shardsmith.core.leftovers import use_scratch
from shardsmith.core.logs import run_job
from shardsmith.formats.energon import EnergonError, write_meta
from shardsmith.shards.write import read_members


def main() -> None:
    use_scratch(snakemake.params.scratch)  # TMPDIR, where SQLite spills while it builds the indexes
    tables = list(snakemake.input.members)
    shards = (
        (Path(p).name.removesuffix(".members.parquet") + ".tar", read_members(p)) for p in tables
    )  # one at a time
    out_dir = Path(snakemake.output.info).parent.parent
    counts = write_meta(out_dir, shards, val_shards=snakemake.params.val_shards)
    print(
        f"{out_dir}/.nv-meta: {sum(counts.values())} samples in {len(counts)} shards, "
        f"{snakemake.params.val_shards} held out as val"
    )


run_job(snakemake.log[0], main, expected=(EnergonError,))
