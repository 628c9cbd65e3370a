"""Shard planning's last step (rule plan_shards): every shard's ranges from what each part kept.

The jobs before it decided what leaves the shards (records already published, repeated keys, other stages'
exclusions, near-duplicates) and wrote it as ledger pieces, which carry each part's sample count. Samples keep
the order of the parts and of the records within them, so the same inputs always give the same shards; every
shard holds `samples_per_shard` samples except the last.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from shardsmith.core.atomic import atomic_open
from shardsmith.shards.buckets import DroppedRows, iter_shard_ranges, piece_counts, write_shard_list
from shardsmith.shards.neardup import NearSettings


def copy_near_tables(found: str | os.PathLike, out_dir: str | os.PathLike) -> dict:
    """near_duplicates.parquet and .json beside the plan, where the report and the card read them; the counts."""
    for name in ("near_duplicates.parquet", "near_duplicates.json"):
        with atomic_open(Path(out_dir) / name) as f:
            f.write((Path(found) / name).read_bytes())
    return json.loads((Path(out_dir) / "near_duplicates.json").read_text())


def part_counts(pieces: list[str]) -> list[tuple[str, int]]:
    """Each part's samples, in part order, from the ledger pieces' counts (part -> [samples, dropped])."""
    total: dict[str, int] = {}
    for path in pieces:
        for part, (n, _) in piece_counts(path).items():
            total[part] = total.get(part, 0) + n
    return list(total.items())


def shards_from_pieces(pieces: list[str], samples_per_shard: int) -> Iterator[list[tuple]]:
    """Every shard's ranges (shardsmith.shards.buckets.iter_shard_ranges), as they come, from the ledger pieces:
    their counts, and the rows they name read as a stream (DroppedRows)."""
    return iter_shard_ranges(part_counts(pieces), samples_per_shard, DroppedRows(pieces))


def plan_shards(
    pieces: list[str],
    out_dir: str | os.PathLike,
    *,
    dataset: str,
    samples_per_shard: int,
    near: NearSettings,
    found: str | os.PathLike | None,
    log: Callable[[str], None] = print,
) -> list[str]:
    """Write `{name}.parts` and `{name}.ranges.json` per shard from the ledger pieces (the groups' first, in part
    order, then the near-duplicates'), and with `found` (decide_near_duplicates' folder) copy its tables beside
    them; returns the shard names. Memory grows with the parts and the shards, not the samples."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if found is not None:
        got = copy_near_tables(found, out_dir)
        left = "left out" if near.near == "exclude" else "reported, all kept (dedupe.near: report)"
        log(f"near-duplicates: {got['near_duplicates']} samples in {got['groups']} groups {left}")
    names = write_shard_list(out_dir, dataset, shards_from_pieces(list(pieces), samples_per_shard))
    log(f"{len(names)} shards of at most {samples_per_shard} samples")
    return names
