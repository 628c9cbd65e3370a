"""Rule glue for collect_published: logic in shardsmith.shards.published; a slice of groups, a file each,
committed each (shardsmith.formats.slices)."""

from shardsmith.core.logs import run_job
from shardsmith.formats.filelist import by_part, listed_files
from shardsmith.formats.slices import run_slice
from shardsmith.shards.published import collect_published


def main() -> None:
    samples = by_part(snakemake.input.samples)
    matches, gone = listed_files(snakemake.input.matches), listed_files(snakemake.input.gone)
    groups = {g["group"]: g for g in snakemake.params.groups}

    def make(group, folders):
        old, exclusions, gone_out = (f"{f}/{group}.parquet" for f in folders)
        g = groups[group]
        n = collect_published(
            matches, gone, int(group), [samples[p] for p in g["parts"]], g["first_part"], old, exclusions, gone_out,
            exact=snakemake.params.exact, near=snakemake.params.near,
        )  # fmt: skip
        print(
            f"group {group}: {n['kept_from_earlier_versions']} samples kept from published versions; "
            f"{n['excluded']} new ones already published (url or sha256) left out; "
            f"{n['gone']} published records no longer in the build"
        )

    run_slice(snakemake, list(groups), make, __file__)


run_job(snakemake.log[0], main)
