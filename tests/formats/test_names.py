"""Shard names (shardsmith.formats.names): the file names the workflow writes and the brace pattern of a run."""

import braceexpand

from shardsmith.formats.names import brace_pattern, shard_name


def test_shard_names_sort_in_shard_order():
    names = [shard_name("ds", i) for i in (0, 9, 10, 123456)]
    assert names == ["ds-000000", "ds-000009", "ds-000010", "ds-123456"] and sorted(names) == names


def test_the_brace_pattern_expands_to_exactly_the_shards():
    shards = [f"{shard_name('my-data', i)}.tar" for i in range(12)]
    pattern = brace_pattern(list(reversed(shards)))
    assert pattern == "my-data-{000000..000011}.tar"
    assert list(braceexpand.braceexpand(pattern)) == shards


def test_one_shard_is_named_without_braces():
    assert brace_pattern(["ds-000000.tar"]) == "ds-000000.tar"


def test_numbered_ids_have_one_width_a_set_and_sort_as_numbers():
    from shardsmith.formats.names import number, numbered

    assert numbered(3) == ["00000", "00001", "00002"]
    big = numbered(117_000)
    assert big[0] == "000000" and big[-1] == "116999" and sorted(big) == big
    assert number(42, 117_000) == "000042" and number(42, 100) == "00042"
