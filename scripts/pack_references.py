"""Rule glue for pack_references: logic in shardsmith.download.references."""

from shardsmith.core.logs import run_job
from shardsmith.download.references import pack_references


def main() -> None:
    out = snakemake.output
    n = pack_references(snakemake.params.sets, snakemake.input.table, out.tar, out.samples, snakemake.params.resize)
    print(f"{n} reference images packed for embed_references")


run_job(snakemake.log[0], main)
