"""Every count planning lays its jobs out by, from the config and the part plan (docs/architecture.md, section 3).

Planning is one pattern used three times (records already published, exact keys, near-duplicates): a map over
groups of consecutive parts, a shuffle of rows into buckets by hash, a reduce per bucket, a gather back per
group. Jobs take slices: consecutive groups (dedupe.groups_per_job) or buckets (dedupe.buckets_per_job).

- key buckets (exact keys and records already published): sized by samples, dedupe.bucket_samples each;
- near-duplicate buckets (and as many partitions of the decision): sized by the entries a sample makes, which
  grow with the cell probes (shardsmith.shards.nearparts.bucket_count);
- `dedupe.buckets` sets both.

The dataset's size is parts x part_size, known before any part is downloaded, so no count changes with what a
download happened to fetch. Units and slices are named by shardsmith.formats.names.number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shardsmith.formats.names import number

if TYPE_CHECKING:  # the Snakefile reads this module at every parse: the search's imports (pandas, faiss) wait
    from shardsmith.shards.nearparts import Layout

SLICE_JOBS = 500  # buckets_per_job and groups_per_job: auto keeps a planning step near this many jobs
# The time limit of the two long planning steps follows their slice: twice what a group's samples or a bucket
# took at LAION-5B (docs/sizing.md), plus a start-up margin, and more on a retry. The profile sets their memory.
NEAR_ENTRIES_MS_A_SAMPLE = 0.85  # split_near_entries at 28 probes: 7.1 minutes a 500,000-sample group
NEAR_PAIRS_MIN_A_BUCKET = 1.7  # find_near_pairs: minutes a bucket
START_MIN = 30


def key_bucket_count(samples: int, bucket_samples: int, override: int | None = None) -> int:
    """Key buckets: a sample writes one key row (and one lookup row a value published records are matched by)."""
    return override if override else max(1, math.ceil(samples / bucket_samples))


def in_a_job(setting: int | str, units: int, least: int) -> int:
    """Units a job of a step takes: the setting, or for auto `least`, or enough to keep a step near SLICE_JOBS."""
    if setting == "auto":
        return max(least, -(-units // SLICE_JOBS))
    return int(setting)


@dataclass(frozen=True)
class Slices:
    """`units` (groups, buckets or partitions) taken `per_job` at a time, consecutive, by `count` jobs."""

    units: int
    per_job: int

    @property
    def count(self) -> int:
        return -(-self.units // self.per_job)

    def of(self, s: int) -> range:
        """The units slice `s` takes, one after another."""
        return range(s * self.per_job, min((s + 1) * self.per_job, self.units))

    def names(self, s: int) -> list[str]:
        """The ids of the units slice `s` takes."""
        return [number(u, self.units) for u in self.of(s)]


@dataclass(frozen=True)
class PlanLayout:
    """The counts of planning's jobs for `parts` parts of `part_size` samples under the config's `dedupe`."""

    parts: int
    part_size: int
    parts_per_group: int
    groups: Slices  # groups of consecutive parts, and their group jobs
    keys: Slices  # key buckets, and their bucket jobs
    near: Layout  # near-duplicate cells, probes and buckets
    near_buckets: Slices  # near-duplicate buckets (= decision partitions), and their bucket jobs
    rounds: int  # decision rounds of the near-duplicate partitions
    near_on: bool = True  # dedupe.near is not off

    @classmethod
    def of(cls, dedupe: dict, part_size: int, parts: int) -> PlanLayout:
        samples = parts * part_size
        per_group = max(1, dedupe["bucket_samples"] // part_size)
        groups = max(1, -(-parts // per_group))
        from shardsmith.shards.neardup import NearSettings

        settings = NearSettings(**dedupe)
        near = settings.layout(samples)
        keys = key_bucket_count(samples, dedupe["bucket_samples"], dedupe.get("buckets"))
        per_job = dedupe.get("buckets_per_job", "auto")
        return cls(
            parts=parts,
            part_size=part_size,
            parts_per_group=per_group,
            groups=Slices(groups, in_a_job(dedupe.get("groups_per_job", "auto"), groups, 4)),
            keys=Slices(keys, in_a_job(per_job, keys, 16)),
            near=near,
            near_buckets=Slices(near.buckets, in_a_job(per_job, near.buckets, 16)),
            rounds=settings.rounds_for(near),
            near_on=dedupe.get("near") != "off",
        )

    @property
    def one_job(self) -> bool:
        """Whether planning is one job (shardsmith.shards.onejob): one group, one key bucket and one
        near-duplicate bucket, so that every step would be a single job of a single unit."""
        return self.groups.units == 1 and self.keys.units == 1 and (self.near_buckets.units == 1 or not self.near_on)

    @property
    def samples(self) -> int:
        return self.parts * self.part_size

    def group_parts(self, g: int) -> range:
        """The part indexes of group `g`."""
        return range(g * self.parts_per_group, min((g + 1) * self.parts_per_group, self.parts))

    def slice_groups(self, s: int, part_ids: list[str]) -> list[dict]:
        """The groups slice `s` takes, one after another: id, first part's index and part ids."""
        return [
            {"group": number(g, self.groups.units), "first_part": g * self.parts_per_group,
             "parts": [part_ids[p] for p in self.group_parts(g)]}
            for g in self.groups.of(s)
        ]  # fmt: skip

    def near_entries_minutes(self, s: int, attempt: int = 1) -> int:
        """split_near_entries' time limit for group slice `s`: twice its samples' work, and more on a retry."""
        samples = sum(len(self.group_parts(g)) for g in self.groups.of(s)) * self.part_size
        return attempt * (START_MIN + round(2 * samples * NEAR_ENTRIES_MS_A_SAMPLE / 60_000))

    def near_pairs_minutes(self, s: int, attempt: int = 1) -> int:
        """find_near_pairs' time limit for bucket slice `s`: twice its buckets' work, and more on a retry."""
        return attempt * (START_MIN + round(2 * len(self.near_buckets.of(s)) * NEAR_PAIRS_MIN_A_BUCKET))
