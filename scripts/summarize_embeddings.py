"""Rule glue for summarize_embeddings: logic in shardsmith.embed.stats."""

from shardsmith.core.logs import run_job
from shardsmith.embed.stats import write_stats
from shardsmith.formats.filelist import listed_files


def main() -> None:
    stats = write_stats(
        snakemake.output[0],
        shard_scores_paths=listed_files(snakemake.input.scores),
        shard_sums_paths=listed_files(snakemake.input.sums),
        part_infos=listed_files(snakemake.input.infos),
        model=snakemake.params.model,
        exclusions=listed_files(snakemake.input.exclusions),
        min_similarity=snakemake.params.min_similarity,
        shard_embeddings_paths=listed_files(snakemake.input.embeddings),
        resize=snakemake.params.resize,
        selected_out=listed_files(snakemake.input.selected_out) if snakemake.input.selected_out else None,
    )
    sim = stats["similarity"]
    print(f"{stats['counts']['published']} published samples, similarity mean {sim.get('mean')} std {sim.get('std')}")
    if stats["random_weights"]:
        print(stats["provenance"]["weights_statement"])


run_job(snakemake.log[0], main)
