"""Rule glue for write_shard: logic in shardsmith.shards.write, shardsmith.formats.dali and shardsmith.formats.energon
(the loaders' per-shard indexes) and shardsmith.shards.validate (re-reading)."""

import json
import os
from pathlib import Path

from shardsmith.core.atomic import atomic_open, atomic_write_text, sha256_file
from shardsmith.core.logs import run_job
from shardsmith.formats import dali, energon
from shardsmith.shards.buckets import shard_rows
from shardsmith.shards.validate import validate_shard, write_json
from shardsmith.shards.write import read_members, write_shard


def main() -> None:
    out = snakemake.output
    name = lambda p: Path(p).name.split(".")[0]  # noqa: E731
    parts = {name(p): p for p in snakemake.input.parts}
    ranges = json.loads(Path(snakemake.input.ranges).read_text())
    rows = shard_rows(ranges, {name(p): p for p in snakemake.input.samples})
    with atomic_open(out.plan) as f:
        rows.to_parquet(f, index=False)
    info = write_shard(out.plan, parts, out.tar, out.info, out.members, out.manifest)
    print(f"{info['shard']}: {info['nsamples']} samples, {info['filesize']} bytes")
    members = read_members(out.members)
    dali.write_index(out.dali_index, members)
    energon.write_tar_index(out.energon_index, members)
    # the loaders' indexes, hashed now (still in the page cache) so that publishing need not read them again
    info["files"] = {
        Path(p).name: {"size": os.path.getsize(p), "sha256": sha256_file(p)}
        for p in (out.dali_index, out.energon_index)
    }
    atomic_write_text(out.info, json.dumps(info, indent=1, sort_keys=True) + "\n")
    resize = snakemake.params.resize
    report = validate_shard(
        out.tar,
        out.plan,
        resize["max_side"],
        resize["max_pixels"],
        snakemake.params.decode_per_shard,
        dali_index=out.dali_index,
        energon_index=out.energon_index,
    )
    write_json(out.report, report)  # problems fail validate_dataset, with every shard's listed
    print(
        f"{report['shard']}: {report['passed']} of {report['groups']} samples pass {report['loader']}'s reader and "
        f"filter, {report['decoded']} images decoded again; DALI and Energon indexes checked against the tar"
    )
    for problem in report["problems"]:
        print(f"  problem: {problem}")


run_job(snakemake.log[0], main)
