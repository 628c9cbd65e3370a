"""Rule glue for write_card: logic in shardsmith.report.card."""

import json
from pathlib import Path

from shardsmith.core.atomic import atomic_write_text
from shardsmith.core.logs import run_job
from shardsmith.formats.filelist import listed_files
from shardsmith.formats.index import rejected_by_source
from shardsmith.report.card import card_text


def load(path: str) -> dict:
    return json.loads(Path(path).read_text())


def main() -> None:
    emb = list(snakemake.input.embedding_stats)
    reports = listed_files(snakemake.input.reports)  # none when every record was rejected: validate_dataset says so
    stats = load(snakemake.input.stats)
    if "rejected_by_source" not in stats:  # indexed by an earlier version, which did not count them
        stats["rejected_by_source"] = rejected_by_source(snakemake.input.rejected)
    text = card_text(
        snakemake.params.config,
        stats=stats,
        sizes=load(snakemake.input.sizes),
        loader=load(reports[0])["loader"] if reports else None,  # the reader every shard was read back with
        emb_stats=load(emb[0]) if emb else None,
        near=load(near) if (near := Path(snakemake.input.plan_dir) / "near_duplicates.json").exists() else None,
        selection=load(snakemake.input.selection[0])["summary"] if snakemake.input.selection else None,
        # what plan_parts' id-list filters matched (shardsmith.download.filters.ID_LISTS, beside the part plans)
        id_lists=load(ids) if (ids := Path(snakemake.input.parts_dir) / "id_lists.json").exists() else None,
    )
    atomic_write_text(snakemake.output[0], text)
    print(f"dataset card: {snakemake.output[0]}")


run_job(snakemake.log[0], main)
