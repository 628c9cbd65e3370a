"""Rule glue for plan_shards: logic in shardsmith.shards.plan. What leaves the shards was decided by the jobs
before it (collect_published, decide_near_duplicates, find_duplicate_keys), or for a small dataset by the same
steps run first in this job (shardsmith.shards.onejob); this needs each part's count."""

from pathlib import Path

from shardsmith.core.logs import run_job
from shardsmith.formats.filelist import listed_files
from shardsmith.shards.neardup import NearSettings
from shardsmith.shards.onejob import plan_in_one_job
from shardsmith.shards.plan import plan_shards


def main() -> None:
    params = snakemake.params
    plan_in_one_job(params.steps, snakemake.config)  # none, unless planning is one job
    layout, found = params.layout, list(params.found)
    names = plan_shards(
        listed_files(params.pieces),
        snakemake.output[0],
        dataset=layout["dataset"],
        samples_per_shard=layout["samples_per_shard"],
        near=NearSettings(**params.near),
        found=Path(found[0]).parent if found else None,
    )
    print(f"planned {len(names)} shards of at most {layout['samples_per_shard']} samples")


run_job(snakemake.log[0], main)
