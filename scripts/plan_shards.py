"""Rule glue for plan_shards: logic in shardsmith.shards.plan. What leaves the shards was decided by the jobs
before it (collect_published, decide_near_duplicates, find_duplicate_keys); this needs each part's count."""

from pathlib import Path

from shardsmith.core.logs import run_job
from shardsmith.formats.filelist import listed_files
from shardsmith.shards.neardup import NearSettings
from shardsmith.shards.plan import plan_shards


def main() -> None:
    layout = snakemake.params.layout
    near = list(snakemake.input.near)
    names = plan_shards(
        listed_files(snakemake.input.pieces),
        snakemake.output[0],
        dataset=layout["dataset"],
        samples_per_shard=layout["samples_per_shard"],
        near=NearSettings(**snakemake.params.near),
        found=Path(near[0]).parent if near else None,
    )
    print(f"planned {len(names)} shards of at most {layout['samples_per_shard']} samples")


run_job(snakemake.log[0], main)
