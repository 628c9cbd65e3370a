"""Rule glue for split_near_entries: logic in shardsmith.shards.neardup and shardsmith.shards.nearparts; a slice
of groups, a file each, committed each (shardsmith.formats.slices)."""

import os

import numpy as np
import pandas as pd

from shardsmith.core.logs import run_job
from shardsmith.formats.filelist import by_part
from shardsmith.formats.slices import run_slice
from shardsmith.shards.buckets import dropped_ids
from shardsmith.shards.neardup import reference_candidates, split_near_entries
from shardsmith.shards.sampleid import row_of


def main() -> None:
    inp = snakemake.input
    samples, embeddings, scores = by_part(inp.samples), by_part(inp.embeddings), by_part(inp.scores)
    published, gone = list(inp.published), list(inp.gone)
    references = reference_candidates(pd.read_parquet(inp.references[0])) if inp.references else None
    reference_embeddings = None
    if inp.reference_embeddings:  # in the references' order (their keys), as embed_references wrote them
        with np.load(inp.reference_embeddings[0], allow_pickle=False) as z:
            at = pd.Index(z["key"]).get_indexer(references["key"])
            if (at < 0).any():
                raise ValueError(f"{inp.reference_embeddings[0]} lacks reference images: run embed_references again")
            reference_embeddings = z["image"][at]
    groups = {g["group"]: g for g in snakemake.params.groups}

    def make(group, folders):
        first, parts = groups[group]["first_part"], groups[group]["parts"]
        piece = os.path.join(inp.dropped, f"{group}.parquet")
        # each part's rows the exact steps left out, as the group's ledger piece names them
        dropped = [row_of(dropped_ids([piece], first + i)) for i in range(len(parts))]
        gone_here = pd.read_parquet(os.path.join(gone[0], f"{group}.parquet")) if gone else None
        first_group = references is not None and first == 0
        if first_group:  # the reference images, once, in the first group's entries
            gone_here = pd.concat([*([gone_here] if gone_here is not None else []), references])
        n = split_near_entries(
            [samples[p] for p in parts],
            first,
            dropped,
            os.path.join(published[0], f"{group}.parquet") if published else None,
            inp.cells,
            f"{folders[0]}/{group}.arrow",
            f"{folders[1]}/{group}.arrow",
            [embeddings[p] for p in parts] if embeddings else [],
            gone_here,
            snakemake.params.parts,
            [scores[p] for p in parts] if scores else [],
            snakemake.params.similarity,
            reference_embeddings if first_group else None,
        )
        kept = len(gone_here) if gone_here is not None else 0
        extra = f", and {kept} published ones gone from the build or reference images" if kept else ""
        print(f"group {group}: {n} samples split into the near-duplicate buckets{extra}")

    run_slice(snakemake, list(groups), make, __file__)


run_job(snakemake.log[0], main)
