"""Rule glue for select_samples: logic in shardsmith.embed.select; a slice of groups, a file each, committed
each (shardsmith.formats.slices)."""

import json
from pathlib import Path

import pandas as pd

from shardsmith.core.logs import run_job
from shardsmith.embed.select import SelectRule, select_samples
from shardsmith.formats.filelist import by_part
from shardsmith.formats.slices import run_slice


def main() -> None:
    scores, rules = by_part(snakemake.input.scores), [SelectRule(**r) for r in snakemake.params.rules]
    selection = json.loads(Path(snakemake.input.selection).read_text())
    groups = {g["group"]: g for g in snakemake.params.groups}

    def make(group, folders):
        parts = [scores[p] for p in groups[group]["parts"]]
        low = [f"{folder}/{group}.parquet" for folder in snakemake.input.low]  # embed.min_similarity's, first
        excluded = set(pd.concat([pd.read_parquet(t, columns=["key"]) for t in low])["key"]) if low else set()
        n = select_samples(parts, rules, selection, group, f"{folders[0]}/{group}.parquet", excluded)
        print(f"group {group}: {n} samples left out by the selection ({len(excluded)} already below min_similarity)")

    run_slice(snakemake, list(groups), make, __file__)


run_job(snakemake.log[0], main)
