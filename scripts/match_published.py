"""Rule glue for match_published: logic in shardsmith.shards.published."""

from pathlib import Path

from shardsmith.core.logs import run_job
from shardsmith.formats.filelist import listed_files
from shardsmith.shards.published import match_published


def main() -> None:
    out, params = snakemake.output, snakemake.params
    records, lookups = listed_files(snakemake.input.records), listed_files(snakemake.input.lookups)
    for folder in (out.matches, out.gone):
        Path(folder).mkdir(parents=True, exist_ok=True)
    for bucket in params.own:  # one bucket at a time
        name = f"{bucket:05d}.arrow"
        n = match_published(
            records, lookups, bucket, params.groups, params.parts_per_group, f"{out.matches}/{name}",
            f"{out.gone}/{name}", near=params.near,
        )  # fmt: skip
        print(
            f"bucket {bucket:05d}: {n['published']} published lookups, {n['samples']} of samples, "
            f"{n['matched']} matched; {n['gone']} published records gone from the build"
        )


run_job(snakemake.log[0], main)
