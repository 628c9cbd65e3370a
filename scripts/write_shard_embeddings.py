"""Rule glue for write_shard_embeddings: a batch of shards (shardsmith.formats.batches), each shard's embeddings
from its parts' (shardsmith.embed.stats)."""

from pathlib import Path

from shardsmith.core.logs import run_job
from shardsmith.embed.stats import write_shard_embeddings
from shardsmith.formats import batches


def main() -> None:
    layout = snakemake.params.layout
    embeddings = {Path(p).stem: p for p in snakemake.input.embeddings}
    code = batches.code_digest([__file__])  # Snakemake sets __file__ to the script itself

    def work():
        for shard in snakemake.params.shards:
            written, out = batches.scored_shard(layout, shard["shard"])
            plan, parts = written["plan"], [embeddings[p] for p in shard["parts"]]
            yield batches.ShardWork(
                shard["shard"],
                out["embeddings_written"],
                batches.fingerprint([], [plan, *parts], {}, code),
                [out["embeddings"]],
                lambda plan=plan, out=out, parts=parts: write_shard_embeddings(plan, parts, out["embeddings"]),
            )

    batches.write_batch(work(), snakemake.output[0])


run_job(snakemake.log[0], main)
