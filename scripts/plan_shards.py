"""Rule glue for plan_shards: logic in shardsmith.shards, shardsmith.dedupe (records already published) and
shardsmith.neardup (near-duplicate images)."""

import json
from pathlib import Path

import pandas as pd

from shardsmith.dedupe import PublishedManifestError, published_records, write_exclusions
from shardsmith.logs import run_job
from shardsmith.neardup import NearSettings, find_near_duplicates, summary, write_tables
from shardsmith.s3 import S3Error, S3Settings
from shardsmith.shards import plan_shards
from shardsmith.stores import PublishError
from shardsmith.tario import atomic_write_text


def main() -> None:
    paths = list(snakemake.input.samples)
    parts = [Path(p).name.split(".")[0] for p in paths]
    out_dir = Path(snakemake.output[0])
    out_dir.mkdir(parents=True, exist_ok=True)
    exclusions = list(snakemake.input.exclusions)
    dedupe, near = snakemake.params.dedupe, NearSettings(**snakemake.params.near)
    published = None
    if dedupe:
        published = published_records(dedupe["dest"], dedupe["dataset"], S3Settings(**dedupe["s3"]))
    if dedupe and dedupe["exact"]:
        out = out_dir / "already_published.parquet"
        n = write_exclusions(paths, published, out)
        exclusions.append(str(out))
        print(
            f"{n['samples']} samples: {n['kept_from_earlier_versions']} kept from {n['versions']} published versions, "
            f"{n['excluded']} new ones already published (url or image sha256) left out"
        )
    if near.near != "off":
        excluded = (
            set(pd.concat([pd.read_parquet(p, columns=["key"])["key"] for p in exclusions])) if exclusions else set()
        )
        found, compared = find_near_duplicates(
            paths, parts, near, excluded, published, list(snakemake.input.embeddings), snakemake.params.scratch
        )
        exclusions += write_tables(found, out_dir, exclude=near.near == "exclude")
        counts = summary(found, compared)
        atomic_write_text(
            out_dir / "near_duplicates.json", json.dumps({**counts, "settings": vars(near)}, indent=1) + "\n"
        )
        left = "left out" if near.near == "exclude" else "reported, all kept (dedupe.near: report)"
        print(f"near-duplicates: {counts['near_duplicates']} samples in {counts['groups']} groups {left}")
    names = plan_shards(
        paths,
        part_ids=parts,
        dataset=snakemake.params.layout["dataset"],
        samples_per_shard=snakemake.params.layout["samples_per_shard"],
        out_dir=out_dir,
        exclusions=exclusions,
    )
    print(f"planned {len(names)} shards of at most {snakemake.params.layout['samples_per_shard']} samples")


run_job(snakemake.log[0], main, expected=(PublishedManifestError, PublishError, S3Error))
