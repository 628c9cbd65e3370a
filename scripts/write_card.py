"""Rule glue for write_card: logic in shardsmith.card."""

import sys

sys.path.insert(0, f"{snakemake.scriptdir}/..")  # the shardsmith package beside scripts/

import json
from pathlib import Path

from shardsmith.card import card_text
from shardsmith.logs import run_job
from shardsmith.report import rejection_summary
from shardsmith.tario import atomic_write_text


def load(path: str) -> dict:
    return json.loads(Path(path).read_text())


def main() -> None:
    by_source_stage = rejection_summary(snakemake.input.rejected)["by_source_stage"]
    rejected_by_source: dict[str, int] = {}
    for (source, _stage), n in by_source_stage.items():
        rejected_by_source[source] = rejected_by_source.get(source, 0) + n
    emb = list(snakemake.input.embedding_stats)
    text = card_text(
        snakemake.params.config,
        stats=load(snakemake.input.stats),
        sizes=load(snakemake.input.sizes),
        validation=load(snakemake.input.validation),
        rejected_by_source=rejected_by_source,
        emb_stats=load(emb[0]) if emb else None,
    )
    atomic_write_text(snakemake.output[0], text)
    print(f"dataset card: {snakemake.output[0]}")


run_job(snakemake.log[0], main)
