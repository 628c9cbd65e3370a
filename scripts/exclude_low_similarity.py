"""Rule glue for exclude_low_similarity: logic in shardsmith.embed.stats; a slice of groups, a file each."""

from shardsmith.core.logs import run_job
from shardsmith.embed.stats import write_exclusions
from shardsmith.formats.filelist import by_part, slice_file


def main() -> None:
    scores, threshold = by_part(snakemake.input.scores), snakemake.params.min_similarity
    for g in snakemake.params.groups:
        out = slice_file(snakemake.output[0], g["group"], ".parquet")
        n = write_exclusions([scores[p] for p in g["parts"]], snakemake.params.model, threshold, out)
        print(f"group {g['group']}: {n} samples below min_similarity {threshold}")


run_job(snakemake.log[0], main)
