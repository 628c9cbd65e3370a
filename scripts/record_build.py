"""Rule glue for record_build: logic in shardsmith.publish.dataset (build metadata published as build.json)."""

from shardsmith.core.logs import run_job
from shardsmith.formats.build import build_info, write_build_info


def main() -> None:
    info = build_info(snakemake.params.config, snakemake.params.snakemake_version, f"{snakemake.scriptdir}/..")
    write_build_info(snakemake.output[0], info)
    print(f"config fingerprint {info['config_fingerprint']}, code fingerprint {info['code_fingerprint']}")


run_job(snakemake.log[0], main)
