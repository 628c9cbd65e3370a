"""Rule glue for write_shard_scores: a batch of shards (shardsmith.formats.batches), each scored by
shardsmith.embed.stats, and its manifest piece with the scores (shardsmith.formats.index)."""

from pathlib import Path

from shardsmith.core.logs import run_job
from shardsmith.embed.stats import write_shard_scores
from shardsmith.formats import batches
from shardsmith.formats.index import write_scored_manifest_piece


def main() -> None:
    layout = snakemake.params.layout
    scores = {Path(p).stem: p for p in snakemake.input.scores}
    embeddings = {Path(p).stem: p for p in snakemake.input.embeddings}
    code = batches.code_digest([__file__])  # Snakemake sets __file__ to the script itself

    def work():
        for shard in snakemake.params.shards:
            written, out = batches.scored_shard(layout, shard["shard"])
            plan, manifest = written["plan"], written["manifest"]
            inputs = [scores[p] for p in shard["parts"]], [embeddings[p] for p in shard["parts"]]

            def write(plan=plan, manifest=manifest, out=out, inputs=inputs):
                write_shard_scores(plan, *inputs, out_scores=out["scores"], out_sums=out["sums"])
                write_scored_manifest_piece(manifest, out["scores"], out["manifest"])

            yield batches.ShardWork(
                shard["shard"],
                out["scores_written"],
                batches.fingerprint([], [plan, manifest, *inputs[0], *inputs[1]], {}, code),
                [out["scores"], out["sums"], out["manifest"]],
                write,
            )

    batches.write_batch(work(), snakemake.output[0])


run_job(snakemake.log[0], main)
