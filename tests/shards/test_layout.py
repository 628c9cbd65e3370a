"""The counts planning lays its jobs out by (shardsmith.shards.layout), at a demo's size and at LAION-5B's."""

import re
from pathlib import Path

import pytest

from shardsmith.formats.batches import batch_count
from shardsmith.formats.names import numbered
from shardsmith.shards.layout import SLICE_JOBS, PlanLayout
from shardsmith.shards.nearparts import bucket_count, cell_count

DEFAULTS = {"bucket_samples": 500_000, "cell_samples": 500_000, "cell_probes": None, "buckets": None,
            "decision_rounds": 3, "buckets_per_job": "auto", "groups_per_job": "auto"}  # fmt: skip
LAION_5B = {"parts": 3_072, "part_size": 2_000_000}  # docs/sizing.md
CONSTRAINTS = Path(__file__).resolve().parents[2] / "rules" / "common.smk"


def covered(slices) -> list[int]:
    return [u for s in range(slices.count) for u in slices.of(s)]


def test_a_small_run_is_one_group_one_bucket_and_one_round():
    layout = PlanLayout.of(DEFAULTS, 5_000, 2)
    assert (layout.groups.units, layout.keys.units, layout.near.buckets, layout.rounds) == (1, 1, 1, 1)
    assert (layout.groups.count, layout.keys.count, layout.near_buckets.count) == (1, 1, 1)
    assert list(layout.group_parts(0)) == [0, 1]
    assert layout.slice_groups(0, ["a-000000", "a-000001"]) == [
        {"group": "00000", "first_part": 0, "parts": ["a-000000", "a-000001"]}
    ]


def test_planning_is_one_job_only_where_every_step_has_one_unit():
    assert PlanLayout.of(DEFAULTS, 5_000, 2).one_job
    assert PlanLayout.of(DEFAULTS, 500_000, 1).one_job  # a group and a bucket at bucket_samples exactly
    assert not PlanLayout.of(DEFAULTS, 500_000, 2).one_job  # two groups (and two key buckets)
    assert not PlanLayout.of({**DEFAULTS, "buckets": 3}, 1_000, 2).one_job  # buckets set: three of each
    many_near = {**DEFAULTS, "cell_samples": 1_000, "bucket_samples": 10_000_000}
    layout = PlanLayout.of(many_near, 1_000_000, 4)  # one group and key bucket; the probes make near buckets
    assert (layout.groups.units, layout.keys.units) == (1, 1) and layout.near.buckets > 1
    assert not layout.one_job
    assert PlanLayout.of({**many_near, "near": "off"}, 1_000_000, 4).one_job  # no near-duplicate buckets to run


def test_key_buckets_follow_the_samples_and_near_buckets_the_probes():
    layout = PlanLayout.of(DEFAULTS, LAION_5B["part_size"], LAION_5B["parts"])
    samples = LAION_5B["parts"] * LAION_5B["part_size"]
    assert layout.keys.units == samples // DEFAULTS["bucket_samples"] == 12_288
    cells, probes = cell_count(samples, DEFAULTS["cell_samples"])
    assert (layout.near.cells, layout.near.probes) == (cells, probes) and probes > 2
    assert layout.near.buckets == bucket_count(samples, DEFAULTS["bucket_samples"], None, probes) > layout.keys.units
    assert layout.parts_per_group == 1 and layout.groups.units == LAION_5B["parts"]  # a part is a group


@pytest.mark.parametrize("per_job", ["auto", 1, 7])
def test_every_unit_is_in_exactly_one_slice_in_order(per_job):
    dedupe = {**DEFAULTS, "buckets_per_job": per_job, "groups_per_job": per_job}
    layout = PlanLayout.of(dedupe, LAION_5B["part_size"], LAION_5B["parts"])
    for slices in (layout.groups, layout.keys, layout.near_buckets):
        assert covered(slices) == list(range(slices.units))
        if per_job == "auto":
            assert slices.count <= SLICE_JOBS
    parts = [p for g in range(layout.groups.units) for p in layout.group_parts(g)]
    assert parts == list(range(LAION_5B["parts"]))


def test_buckets_set_in_the_config_set_both_kinds():
    layout = PlanLayout.of({**DEFAULTS, "buckets": 5, "buckets_per_job": 2}, 1_000, 12)
    assert layout.keys.units == layout.near.buckets == 5
    names = [layout.keys.names(s) for s in range(layout.keys.count)]
    assert names == [["00000", "00001"], ["00002", "00003"], ["00004"]]
    assert layout.rounds == 3


def test_ids_at_laion_5b_fit_the_wildcards_at_any_per_job():
    """shards_per_job: 1 at LAION-5B makes 117,000 write_shard batches; buckets_per_job: 1, 65,536 slices."""
    constraints = dict(re.findall(r'^\s+(\w+)=r"([^"]+)",$', CONSTRAINTS.read_text(), re.M))
    layout = PlanLayout.of({**DEFAULTS, "buckets_per_job": 1, "groups_per_job": 1}, **LAION_5B)
    counts = {"batch": batch_count(117_000, 1), "slice": layout.near_buckets.count, "group": layout.groups.units,
              "bucket": layout.near.buckets, "partition": layout.near.buckets}  # fmt: skip
    assert counts["batch"] == 117_000 and counts["slice"] == layout.near.buckets
    for wildcard, count in counts.items():
        ids = numbered(count)
        assert all(re.fullmatch(constraints[wildcard], i) for i in ids), wildcard
        assert sorted(ids) == ids and len(set(ids)) == count  # names sort as numbers


def test_time_limits_follow_the_slice_and_grow_with_each_retry():
    layout = PlanLayout.of({**DEFAULTS, "buckets_per_job": 132, "groups_per_job": 7}, **LAION_5B)
    # 7 groups of 2,000,000 samples at 0.85 ms a sample, twice; 132 buckets at 1.7 minutes, twice
    assert layout.near_entries_minutes(0) == 30 + round(2 * 7 * 2_000_000 * 0.85 / 60_000) == 427
    assert layout.near_pairs_minutes(0) == 30 + round(2 * 132 * 1.7) == 479
    assert layout.near_pairs_minutes(0, attempt=2) == 2 * 479
    last = layout.near_buckets.count - 1  # the last slice holds the buckets left over
    assert layout.near_pairs_minutes(last) == 30 + round(2 * len(layout.near_buckets.of(last)) * 1.7)
