"""Rule glue for write_shard_scores: a batch of shards (shardsmith.formats.batches), each scored by
shardsmith.embed.stats."""

import json
from pathlib import Path

from shardsmith.core.atomic import atomic_write_text
from shardsmith.core.logs import run_job
from shardsmith.embed.stats import write_shard_scores
from shardsmith.formats import batches


def main() -> None:
    layout = snakemake.params.layout
    by_part = lambda files: {Path(p).stem: p for p in files}  # noqa: E731
    scores, embeddings = by_part(snakemake.input.scores), by_part(snakemake.input.embeddings)
    code = batches.code_digest([__file__])  # Snakemake sets __file__ to the script itself
    done = {"written": [], "kept": []}
    for shard in snakemake.params.shards:
        plan = batches.shard_paths(layout["work"], layout["out"], layout["dataset"], shard["shard"])["plan"]
        out = batches.score_paths(layout["work"], layout["out"], layout["dataset"], shard["shard"])
        part_scores = [scores[p] for p in shard["parts"]]
        part_embeddings = [embeddings[p] for p in shard["parts"]]
        fp = batches.fingerprint([], [plan, *part_scores, *part_embeddings], {}, code)
        if batches.is_written(out["scores_written"], fp, [out["scores"], out["sums"]]):
            done["kept"].append(shard["shard"])
            continue
        batches.forget_written(out["scores_written"])
        n = write_shard_scores(plan, part_scores, part_embeddings, out_scores=out["scores"], out_sums=out["sums"])
        batches.mark_written(out["scores_written"], fp)
        done["written"].append(shard["shard"])
        print(f"{out['scores']}: {n} samples")
    atomic_write_text(snakemake.output[0], json.dumps(done, indent=1) + "\n")
    print(f"{len(done['written'])} shards scored, {len(done['kept'])} kept")


run_job(snakemake.log[0], main)
