"""Rule glue for plan_parts: logic in shardsmith.download.sources."""

from shardsmith.core.leftovers import use_scratch
from shardsmith.core.logs import run_job
from shardsmith.download.fetch.client import Fetcher
from shardsmith.download.fetch.settings import FetchSettings
from shardsmith.download.sources import plan_parts
from shardsmith.storage.s3 import S3Settings


def main() -> None:
    use_scratch(snakemake.params.scratch)  # remote manifests are copied there to be read
    settings = FetchSettings.from_config({**snakemake.params.download, "part_deadline_s": None})
    fetcher = Fetcher(settings, S3Settings(**snakemake.params.s3))
    p = snakemake.params
    parts = plan_parts(
        p.sources, p.part_size, snakemake.output[0], fetcher, filters=p.filters, needed_columns=p.select_columns
    )
    print(f"planned {len(parts)} parts of at most {snakemake.params.part_size} records")


run_job(snakemake.log[0], main)
