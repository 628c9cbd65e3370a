"""Shards written a batch a job: write_shard (and write_shard_scores) take consecutive shards one after another,
so that the DAG holds a job per batch, not per shard (at LAION-5B ~117,000 shards).

A shard's files stay where a job per shard would write them; only the batch's record is a declared output.
A shard is committed by its `.written` file, written last: the fingerprint of its inputs (the small plan files
by content, the large part files by size and time), the job's settings and the code that writes it. A rerun of
the batch (killed, or one of its shards changed) keeps every shard whose fingerprint is unchanged and whose
files are all there, and writes the others again.
"""

import hashlib
import json
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from shardsmith.core.atomic import atomic_write_text, sha256_file
from shardsmith.core.errors import ConfigError

AUTO_JOBS = 1000  # shards_per_job: auto keeps the write_shard jobs near this many
# and gives a job at least this many samples: a job's start (Python, PIL, pandas: ~0.5 s) against ~0.7 ms a
# sample written and checked keeps the start near a sixth of the job, where small shards would make it half
AUTO_SAMPLES = 4000


def shards_per_job(setting: int | str, shards: int, samples_per_shard: int = AUTO_SAMPLES) -> int:
    """The shards a job takes: `setting`, or for `auto` enough for AUTO_SAMPLES samples a job (one a job at
    shards of that size or more) up to AUTO_JOBS shards, then enough to keep the jobs near AUTO_JOBS."""
    if setting == "auto":
        return max(1, -(-shards // AUTO_JOBS), -(-AUTO_SAMPLES // samples_per_shard))
    if isinstance(setting, int) and not isinstance(setting, bool) and setting >= 1:
        return setting
    raise ConfigError(f"shards_per_job: {setting!r} is not a positive number or auto")


def batch_count(shards: int, per_job: int) -> int:
    return max(1, -(-shards // per_job))


def batch_shards(ids: list[str], per_job: int, batch: int) -> list[str]:
    """The shards of batch `batch`: consecutive in the plan's order."""
    return ids[batch * per_job : (batch + 1) * per_job]


# What write_shard writes for each shard, by kind: the workflow's paths (rules/common.smk) and the job's.
def shard_paths(work: str, out: str, dataset: str, shard: str) -> dict[str, str]:
    stem = f"{dataset}-{shard}"
    return {
        "plan": f"{work}/shards/{stem}.samples.parquet",  # the shard's samples, read from its parts
        "tar": f"{out}/{stem}.tar",
        "info": f"{work}/shards/{stem}.json",
        "report": f"{work}/validate/{stem}.json",  # the shard re-read with OpenCLIP's reader and filter
        "members": f"{work}/shards/{stem}.members.parquet",  # where each member landed
        "manifest": f"{work}/shards/{stem}.manifest.parquet",
        "dali_index": f"{out}/{stem}.idx",
        "energon_index": f"{out}/{stem}.tar.idx",
        "written": f"{work}/shards/{stem}.written",
    }


def score_paths(work: str, out: str, dataset: str, shard: str) -> dict[str, str]:
    """What write_shard_scores (scores, sums, the scored manifest piece) and write_shard_embeddings (embeddings)
    write for each shard."""
    stem = f"{dataset}-{shard}"
    return {
        "scores": f"{out}/{stem}.scores.parquet",
        "sums": f"{work}/embed/shards/{stem}.json",
        "scores_written": f"{work}/embed/shards/{stem}.written",
        "embeddings": f"{out}/{stem}.embeddings.npz",
        "embeddings_written": f"{work}/embed/shards/{stem}.embeddings.written",
        "manifest": f"{work}/embed/shards/{stem}.manifest.parquet",  # the shard's manifest piece with its scores
    }


def scored_shard(layout: dict[str, str], shard: str) -> tuple[dict[str, str], dict[str, str]]:
    """(what write_shard writes for the shard, what the embedding jobs write for it), for a rule's `layout`
    param."""
    where = (layout["work"], layout["out"], layout["dataset"], shard)
    return shard_paths(*where), score_paths(*where)


def code_digest(scripts: Iterable[str | os.PathLike] = ()) -> str:
    """sha256 over the given scripts and every shardsmith module this process has imported: a change to the
    code that writes a shard writes it again."""
    digest = hashlib.sha256()
    modules = sorted(
        (name, getattr(m, "__file__", None))
        for name, m in list(sys.modules.items())
        if name == "shardsmith" or name.startswith("shardsmith.")
    )
    for name, path in [*modules, *((Path(s).name, s) for s in scripts)]:
        if path and os.path.isfile(path):
            digest.update(name.encode() + b"\0" + Path(path).read_bytes() + b"\0")
    return digest.hexdigest()


def fingerprint(contents: Iterable[str], stats: Iterable[str], settings: object, code: str) -> str:
    """The inputs a shard is made from: `contents` by sha256 (small plan files), `stats` by name, size and
    modification time (part files: a changed part is a new file), with the settings and code digest."""
    return json.dumps(
        {
            "contents": {os.path.basename(p): sha256_file(p) for p in contents},
            "stats": {os.path.basename(p): [(s := os.stat(p)).st_size, s.st_mtime_ns] for p in stats},
            "settings": settings,
            "code": code,
        },
        sort_keys=True,
    )


@dataclass
class ShardWork:
    """One shard of a batch: its `.written` record, the fingerprint to commit, the files that must be there
    for it to be kept, and what writes it."""

    shard: str
    record: str
    fingerprint: str
    files: list[str]
    write: Callable[[], object]


def write_batch(work: Iterable[ShardWork], out: str | os.PathLike) -> dict[str, list[str]]:
    """Write each shard in turn unless it is written from the same inputs already, commit it, and record the
    batch (shards written, shards kept) at `out`, the job's output."""
    done: dict[str, list[str]] = {"written": [], "kept": []}
    for w in work:
        if is_written(w.record, w.fingerprint, w.files):
            print(f"{w.shard}: kept (written before from the same inputs, settings and code)")
            done["kept"].append(w.shard)
            continue
        forget_written(w.record)
        w.write()
        mark_written(w.record, w.fingerprint)
        done["written"].append(w.shard)
    atomic_write_text(out, json.dumps(done, indent=1) + "\n")
    print(f"{len(done['written'])} shards written, {len(done['kept'])} kept")
    return done


def is_written(record: str, fp: str, files: Iterable[str]) -> bool:
    """Whether the shard was written from the same inputs and all its files are still there."""
    try:
        same = Path(record).read_text() == fp
    except FileNotFoundError:
        return False
    return same and all(os.path.exists(f) for f in files)


def mark_written(record: str, fp: str) -> None:
    atomic_write_text(record, fp)


def forget_written(record: str) -> None:
    """Before writing a shard again: a kill from here on must not leave the old record standing."""
    Path(record).unlink(missing_ok=True)
