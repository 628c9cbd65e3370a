"""Rule glue for collect_published: logic in shardsmith.shards.published; a slice of groups, a file each."""

from shardsmith.core.logs import run_job
from shardsmith.formats.filelist import by_part, listed_files, slice_file
from shardsmith.shards.published import collect_published


def main() -> None:
    out, samples = snakemake.output, by_part(snakemake.input.samples)
    matches, gone = listed_files(snakemake.input.matches), listed_files(snakemake.input.gone)
    for g in snakemake.params.groups:
        group = g["group"]
        n = collect_published(
            matches, gone, int(group), [samples[p] for p in g["parts"]], g["first_part"],
            slice_file(out.old, group, ".parquet"), slice_file(out.exclusions, group, ".parquet"),
            slice_file(out.gone, group, ".parquet"), exact=snakemake.params.exact, near=snakemake.params.near,
        )  # fmt: skip
        print(
            f"group {group}: {n['kept_from_earlier_versions']} samples kept from published versions; "
            f"{n['excluded']} new ones already published (url or sha256) left out; "
            f"{n['gone']} published records no longer in the build"
        )


run_job(snakemake.log[0], main)
