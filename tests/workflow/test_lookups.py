"""What input functions look up: made once per process and listing, and made again when a folder changes."""

import os

import pytest
from snakemake.io import expand

from shardsmith.workflow.lookups import Lookups


class Counted:
    """Snakemake's expand, counting its calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return expand(*args, **kwargs)


def touch(folder, *names):
    for name in names:
        (folder / name).write_text("")
    st = os.stat(folder)  # a later listing must see a new mtime, even within the file system's granularity
    os.utime(folder, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def test_part_ids_are_in_source_order_then_number_and_follow_the_folder(tmp_path):
    touch(tmp_path, "web-000001.parquet", "laion-000000.parquet", "web-000000.parquet", ".hidden.parquet", "x.tmp")
    lookups = Lookups(expand)
    ids = lookups.part_ids(str(tmp_path), ["web", "laion"])
    assert ids == ["web-000000", "web-000001", "laion-000000"]
    assert lookups.part_ids(str(tmp_path), ["web", "laion"]) is ids  # kept while the folder is unchanged
    touch(tmp_path, "web-000002.parquet")
    assert lookups.part_ids(str(tmp_path), ["web", "laion"])[-2:] == ["web-000002", "laion-000000"]


def test_every_file_of_a_set_is_expanded_once_and_again_for_a_new_listing(tmp_path):
    touch(tmp_path, "ds-000000.parts", "ds-000001.parts")
    counted = Counted()
    lookups = Lookups(counted)
    ids = lookups.shard_ids(str(tmp_path))
    first = lookups.every("out/{shard}.tar", "shard", ids)
    assert first == ["out/000000.tar", "out/000001.tar"]
    assert lookups.every("out/{shard}.tar", "shard", lookups.shard_ids(str(tmp_path))) is first
    assert counted.calls == 1
    touch(tmp_path, "ds-000002.parts")
    assert lookups.every("out/{shard}.tar", "shard", lookups.shard_ids(str(tmp_path)))[-1] == "out/000002.tar"
    assert counted.calls == 2


def test_a_count_is_expanded_as_numbered_ids_with_fixed_wildcards():
    lookups = Lookups(expand)
    assert lookups.every("r{round}/{slice}", "slice", 3, round=2) == ["r2/00000", "r2/00001", "r2/00002"]
    wide = lookups.every("{slice}", "slice", 100_001)
    assert wide[0] == "000000" and wide[-1] == "100000"  # one width a set, so names sort as numbers


def test_a_checkpoint_is_kept_once_finished_and_asked_again_while_it_is_not(tmp_path):
    lookups = Lookups(expand)
    asked = []

    def unfinished():
        asked.append(1)
        raise LookupError("not yet")

    for _ in range(2):
        with pytest.raises(LookupError):
            lookups.finished("plan_shards", unfinished)
    assert len(asked) == 2
    assert lookups.finished("plan_shards", lambda: "plan/shards") == "plan/shards"
    assert lookups.finished("plan_shards", unfinished) == "plan/shards"


def test_a_shards_parts_are_read_again_when_its_file_changes(tmp_path):
    path = tmp_path / "ds-000000.parts"
    path.write_text("web-000000\nweb-000001\n")
    lookups = Lookups(expand)
    assert lookups.shard_parts(str(path)) == ["web-000000", "web-000001"]
    path.write_text("web-000001\n")
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert lookups.shard_parts(str(path)) == ["web-000001"]
