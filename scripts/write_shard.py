"""Rule glue for write_shard: a batch of shards (shardsmith.formats.batches), each written by
shardsmith.shards.write, indexed for the loaders (shardsmith.formats.dali, shardsmith.formats.energon) and re-read
(shardsmith.shards.validate)."""

import json
import os
from pathlib import Path

from shardsmith.core.atomic import atomic_open, atomic_write_text, sha256_file
from shardsmith.core.logs import run_job
from shardsmith.formats import batches, dali, energon
from shardsmith.shards.buckets import shard_rows
from shardsmith.shards.validate import validate_shard, write_json
from shardsmith.shards.write import read_members, write_shard


def name(path: str) -> str:
    return Path(path).name.split(".")[0]


def write_one(out: dict[str, str], ranges_path: str, parts: dict[str, str], samples: dict[str, str]) -> None:
    ranges = json.loads(Path(ranges_path).read_text())
    rows = shard_rows(ranges, samples)
    with atomic_open(out["plan"]) as f:
        rows.to_parquet(f, index=False)
    info = write_shard(out["plan"], parts, out["tar"], out["info"], out["members"], out["manifest"])
    print(f"{info['shard']}: {info['nsamples']} samples, {info['filesize']} bytes")
    members = read_members(out["members"])
    dali.write_index(out["dali_index"], members)
    energon.write_tar_index(out["energon_index"], members)
    # the loaders' indexes, hashed now (still in the page cache) so that publishing need not read them again
    info["files"] = {
        Path(p).name: {"size": os.path.getsize(p), "sha256": sha256_file(p)}
        for p in (out["dali_index"], out["energon_index"])
    }
    atomic_write_text(out["info"], json.dumps(info, indent=1, sort_keys=True) + "\n")
    resize = snakemake.params.resize
    report = validate_shard(
        out["tar"],
        out["plan"],
        resize["max_side"],
        resize["max_pixels"],
        snakemake.params.decode_per_shard,
        dali_index=out["dali_index"],
        energon_index=out["energon_index"],
        parts=parts,
    )
    write_json(out["report"], report)  # problems fail validate_dataset, with every shard's listed
    print(
        f"{report['shard']}: {report['passed']} of {report['groups']} samples pass {report['loader']}'s reader and "
        f"filter, {report['decoded']} images decoded again; DALI and Energon indexes checked against the tar"
    )
    for problem in report["problems"]:
        print(f"  problem: {problem}")


def main() -> None:
    layout = snakemake.params.layout
    processed = {name(p): p for p in snakemake.input.parts}
    samples = {name(p): p for p in snakemake.input.samples}
    settings = {"resize": snakemake.params.resize, "decode_per_shard": snakemake.params.decode_per_shard}
    code = batches.code_digest([__file__])  # Snakemake sets __file__ to the script itself

    def work():
        for shard, ranges in zip(snakemake.params.shards, snakemake.input.ranges, strict=True):
            out = batches.shard_paths(layout["work"], layout["out"], layout["dataset"], shard["shard"])
            parts = shard["parts"]
            yield batches.ShardWork(
                shard["shard"],
                out["written"],
                batches.fingerprint([ranges], [f for p in parts for f in (processed[p], samples[p])], settings, code),
                [p for kind, p in out.items() if kind != "written"],
                lambda out=out, ranges=ranges, parts=parts: write_one(
                    out, ranges, {p: processed[p] for p in parts}, {p: samples[p] for p in parts}
                ),
            )

    batches.write_batch(work(), snakemake.output[0])


run_job(snakemake.log[0], main)
