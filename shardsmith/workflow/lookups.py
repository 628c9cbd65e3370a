"""What the workflow's input functions look up, once per process.

Input functions run once per job or more, and a LAION-size DAG has ~30k jobs: the checkpoints' folders, their
listings, the shards' .parts files and the expanded lists of every part's, shard's or slice's file are made
once per process and listing (bench/dryrun_scale.py), not once per job.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shardsmith.formats.names import numbered


class Lookups:
    def __init__(self, expand: Callable[..., list[str]]):
        self._expand = expand  # Snakemake's expand()
        self._cache: dict[tuple, Any] = {}

    def once(self, key: tuple, make: Callable[[], Any]) -> Any:
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def finished(self, name: str, output: Callable[[], str]) -> str:
        """A finished checkpoint's output folder; `output` raises while it is unfinished. Only a successful
        lookup is kept: Snakemake only ever adds to its set of finished checkpoints."""
        return self.once(("checkpoint", name), output)

    def names(self, folder: str, suffix: str) -> list[str]:
        """Names in `folder` ending in `suffix` (as a glob: no dot files), without it; kept per folder mtime.
        The same list object while the folder is unchanged, so what is derived from it can be kept by its id."""
        key = ("names", folder, suffix, os.stat(folder).st_mtime_ns)
        return self.once(
            key, lambda: [n.removesuffix(suffix) for n in os.listdir(folder) if n.endswith(suffix) and n[0] != "."]
        )

    def part_ids(self, folder: str, sources: list[str]) -> list[str]:
        """The part plan's ids (`{source}-{number}.parquet` in `folder`): by source order, then number."""
        ids = self.names(folder, ".parquet")
        order = {name: i for i, name in enumerate(sources)}
        # the listing is kept alongside, so that its id is never reused by a newer list while this is kept
        key = ("part_ids", id(ids))
        return self.once(key, lambda: (ids, sorted(ids, key=lambda p: (order[p.rsplit("-", 1)[0]], p))))[1]

    def shard_ids(self, folder: str) -> list[str]:
        """The shard plan's ids (`{dataset}-{shard}.parts` in `folder`), sorted."""
        names = self.names(folder, ".parts")
        return self.once(("shard_ids", id(names)), lambda: (names, sorted(n.rsplit("-", 1)[1] for n in names)))[1]

    def shard_parts(self, path: str) -> list[str]:
        """The parts a shard draws from (its .parts file)."""
        key = ("parts", path, os.stat(path).st_mtime_ns)
        return self.once(key, lambda: Path(path).read_text().split())

    def every(self, pattern: str, wildcard: str, ids: int | list[str], **fixed: Any) -> list[str]:
        """expand(pattern) over the ids of `wildcard`: a list kept by the caller (part_ids, shard_ids: known by
        its id), or a count (groups, buckets, slices, batches: shardsmith.formats.names.numbered). The jobs of a
        step that read every part's, shard's or bucket's file would otherwise each build the same list of
        thousands (at LAION-5B, 187,200 decision jobs over 62,400 partitions)."""
        known = ids if isinstance(ids, int) else id(ids)
        key = ("every", pattern, wildcard, known, tuple(sorted(fixed.items())))

        def make() -> tuple:
            names = numbered(ids) if isinstance(ids, int) else ids
            return ids, self._expand(pattern, **{wildcard: names}, **fixed)

        return self.once(key, make)[1]
