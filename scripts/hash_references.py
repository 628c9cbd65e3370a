"""Rule glue for hash_references: logic in shardsmith.download.references."""

from shardsmith.core.logs import run_job
from shardsmith.download.references import hash_references


def main() -> None:
    info = hash_references(
        snakemake.params.sets, snakemake.output.table, snakemake.output.info, snakemake.params.resize
    )
    for name, s in info.items():
        print(f"evaluation set {name}: {s['images']} reference images hashed, {len(s['unreadable'])} unreadable")
        for line in s["unreadable"][:10]:
            print(f"  unreadable: {line}")


run_job(snakemake.log[0], main)
