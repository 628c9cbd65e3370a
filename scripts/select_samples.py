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
    rules = [SelectRule(**r) for r in snakemake.params.rules]
    scores, samples, records = (by_part(getattr(snakemake.input, k, [])) for k in ("scores", "samples", "records"))
    selection = json.loads(Path(snakemake.input.selection).read_text())
    groups = {g["group"]: g for g in snakemake.params.groups}

    def make(group, folders):
        ids = groups[group]["parts"]
        parts = [scores[p] for p in ids] if scores else []
        manifest = [(samples[p], records[p]) for p in ids] if samples else []
        low = [f"{folder}/{group}.parquet" for folder in snakemake.input.low]  # embed.min_similarity's, first
        excluded = set(pd.concat([pd.read_parquet(t, columns=["key"]) for t in low])["key"]) if low else set()
        out = f"{folders[0]}/{group}.parquet"
        n = select_samples(parts, rules, selection, group, out, excluded, manifest)
        print(f"group {group}: {n} samples left out by the selection ({len(excluded)} already below min_similarity)")

    run_slice(snakemake, list(groups), make, __file__)


run_job(snakemake.log[0], main)
