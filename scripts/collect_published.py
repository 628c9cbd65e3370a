"""Rule glue for collect_published: logic in shardsmith.shards.published."""

from shardsmith.core.logs import run_job
from shardsmith.formats.filelist import listed_files
from shardsmith.shards.published import collect_published


def main() -> None:
    n = collect_published(
        listed_files(snakemake.input.matches), listed_files(snakemake.input.gone), int(snakemake.wildcards.group),
        list(snakemake.input.samples), snakemake.params.first_part, snakemake.output.old,
        snakemake.output.exclusions, snakemake.output.gone, exact=snakemake.params.exact, near=snakemake.params.near,
    )  # fmt: skip
    print(
        f"{n['kept_from_earlier_versions']} samples kept from published versions; "
        f"{n['excluded']} new ones already published (url or sha256) left out; "
        f"{n['gone']} published records no longer in the build"
    )


run_job(snakemake.log[0], main)
