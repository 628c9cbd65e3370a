"""Rule glue for write_shard_embeddings: a batch of shards (shardsmith.formats.batches), each shard's embeddings
from its parts' (shardsmith.embed.stats)."""

import json
from pathlib import Path

from shardsmith.core.atomic import atomic_write_text
from shardsmith.core.logs import run_job
from shardsmith.embed.stats import write_shard_embeddings
from shardsmith.formats import batches


def main() -> None:
    layout = snakemake.params.layout
    embeddings = {Path(p).stem: p for p in snakemake.input.embeddings}
    code = batches.code_digest([__file__])  # Snakemake sets __file__ to the script itself
    done = {"written": [], "kept": []}
    for shard in snakemake.params.shards:
        plan = batches.shard_paths(layout["work"], layout["out"], layout["dataset"], shard["shard"])["plan"]
        out = batches.score_paths(layout["work"], layout["out"], layout["dataset"], shard["shard"])
        part_embeddings = [embeddings[p] for p in shard["parts"]]
        fp = batches.fingerprint([], [plan, *part_embeddings], {}, code)
        if batches.is_written(out["embeddings_written"], fp, [out["embeddings"]]):
            done["kept"].append(shard["shard"])
            continue
        batches.forget_written(out["embeddings_written"])
        n = write_shard_embeddings(plan, part_embeddings, out["embeddings"])
        batches.mark_written(out["embeddings_written"], fp)
        done["written"].append(shard["shard"])
        print(f"{out['embeddings']}: {n} samples")
    atomic_write_text(snakemake.output[0], json.dumps(done, indent=1) + "\n")


run_job(snakemake.log[0], main)
