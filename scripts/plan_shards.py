"""Rule glue for plan_shards: logic in shardsmith.shards.plan. Records already published and near-duplicates
were found by the jobs before it (find_published, decide_near_duplicates)."""

from pathlib import Path

from shardsmith.core.logs import run_job
from shardsmith.shards.neardup import NearSettings
from shardsmith.shards.plan import plan_dataset


def main() -> None:
    layout = snakemake.params.layout
    near = list(snakemake.input.near)
    names = plan_dataset(
        list(snakemake.input.samples),
        snakemake.output[0],
        dataset=layout["dataset"],
        samples_per_shard=layout["samples_per_shard"],
        exclusions=list(snakemake.input.exclusions),
        dedupe=None,
        near=NearSettings(**snakemake.params.near),
        embeddings=[],
        scratch=snakemake.params.scratch,
        found=Path(near[0]).parent if near else None,
    )
    print(f"planned {len(names)} shards of at most {layout['samples_per_shard']} samples")


run_job(snakemake.log[0], main)
