"""Rule glue for write_energon_meta: logic in shardsmith.formats.energon."""

import json
from pathlib import Path

from shardsmith.core.logs import run_job
from shardsmith.formats.energon import EnergonError, write_meta
from shardsmith.formats.filelist import listed_files


def main() -> None:
    # write_shard's, one at a time
    infos = (json.loads(Path(p).read_text()) for p in listed_files(snakemake.input.infos))
    shards = ((i["shard"], i["nsamples"], i["sha256"]) for i in infos)
    out_dir = Path(snakemake.output.info).parent.parent
    counts = write_meta(out_dir, shards, val_shards=snakemake.params.val_shards)
    print(
        f"{out_dir}/.nv-meta: {sum(counts.values())} samples in {len(counts)} shards, "
        f"{snakemake.params.val_shards} held out as val"
    )


run_job(snakemake.log[0], main, expected=(EnergonError,))
