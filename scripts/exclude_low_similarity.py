"""Rule glue for exclude_low_similarity: logic in shardsmith.embed.stats; a slice of groups, a file each,
committed each (shardsmith.formats.slices)."""

from shardsmith.core.logs import run_job
from shardsmith.embed.stats import exclude_low_similarity
from shardsmith.formats.filelist import by_part
from shardsmith.formats.slices import run_slice


def main() -> None:
    scores, threshold = by_part(snakemake.input.scores), snakemake.params.min_similarity
    groups = {g["group"]: g for g in snakemake.params.groups}

    def make(group, folders):
        parts = groups[group]["parts"]
        out = f"{folders[0]}/{group}.parquet"
        n = exclude_low_similarity([scores[p] for p in parts], snakemake.params.model, threshold, out)
        print(f"group {group}: {n} samples below min_similarity {threshold}")

    run_slice(snakemake, list(groups), make, __file__)


run_job(snakemake.log[0], main)
