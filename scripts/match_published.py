"""Rule glue for match_published: logic in shardsmith.shards.published."""

from shardsmith.core.logs import run_job
from shardsmith.formats.filelist import listed_files
from shardsmith.shards.published import match_published


def main() -> None:
    bucket = int(snakemake.wildcards.bucket)
    n = match_published(
        listed_files(snakemake.input.records), listed_files(snakemake.input.lookups), bucket,
        snakemake.params.groups, snakemake.params.parts_per_group, snakemake.output.matches, snakemake.output.gone,
        near=snakemake.params.near,
    )  # fmt: skip
    print(
        f"bucket {bucket}: {n['published']} published lookups, {n['samples']} of samples, {n['matched']} matched; "
        f"{n['gone']} published records gone from the build"
    )


run_job(snakemake.log[0], main)
