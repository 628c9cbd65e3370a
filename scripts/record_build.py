"""Rule glue for record_build: logic in shardsmith.publish.dataset (build metadata published as build.json)."""

import json
from pathlib import Path

from shardsmith.core.logs import run_job
from shardsmith.formats.build import build_info, write_build_info


def main() -> None:
    info = build_info(snakemake.params.config, snakemake.params.snakemake_version, f"{snakemake.scriptdir}/..")
    if snakemake.input.selection:  # what the selection kept (shardsmith.embed.select)
        info["selection"] = json.loads(Path(snakemake.input.selection[0]).read_text())["summary"]
    write_build_info(snakemake.output[0], info)
    print(f"config fingerprint {info['config_fingerprint']}, code fingerprint {info['code_fingerprint']}")


run_job(snakemake.log[0], main)
