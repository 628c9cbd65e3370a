"""Shards a batch a job: how many a job takes, and which shards a rerun of the batch keeps."""

import os

import pytest

from shardsmith.core.errors import ConfigError
from shardsmith.formats import batches


@pytest.mark.parametrize(
    ("shards", "per_job"), [(1, 1), (1000, 1), (1001, 2), (1_243, 2), (8_278, 9), (117_000, 117), (4_000_000, 4000)]
)
def test_auto_is_a_shard_a_job_up_to_1000_shards_then_keeps_the_jobs_near_1000(shards, per_job):
    assert batches.shards_per_job("auto", shards) == per_job
    assert batches.batch_count(shards, per_job) <= batches.AUTO_JOBS


@pytest.mark.parametrize(("shards", "per_shard", "per_job"), [(8, 1000, 4), (9, 1000, 4), (3, 1000, 4), (8, 3000, 2),
                                                         (8, 10_000, 1), (2_000_000, 100, 2000)])  # fmt: skip
def test_auto_gives_a_job_of_small_shards_enough_samples_to_outweigh_its_start(shards, per_shard, per_job):
    assert batches.shards_per_job("auto", shards, per_shard) == per_job
    assert per_job * per_shard >= batches.AUTO_SAMPLES


@pytest.mark.parametrize("bad", [0, -3, "many", True, 2.5])
def test_a_bad_setting_is_named(bad):
    with pytest.raises(ConfigError, match="shards_per_job"):
        batches.shards_per_job(bad, 100)


@pytest.mark.parametrize(("n", "per_job"), [(1, 1), (5, 3), (10, 5), (11, 4), (3, 10)])
def test_batches_take_every_shard_once_in_order(n, per_job):
    ids = [f"{i:06d}" for i in range(n)]
    count = batches.batch_count(n, per_job)
    taken = [batches.batch_shards(ids, per_job, b) for b in range(count)]
    assert [s for batch in taken for s in batch] == ids
    assert all(0 < len(batch) <= per_job for batch in taken)


def test_paths_are_those_of_a_job_per_shard():
    paths = batches.shard_paths("w", "o", "ds", "000007")
    assert paths["tar"] == "o/ds-000007.tar" and paths["dali_index"] == "o/ds-000007.idx"
    assert paths["energon_index"] == "o/ds-000007.tar.idx" and paths["report"] == "w/validate/ds-000007.json"
    assert batches.score_paths("w", "o", "ds", "000007")["scores"] == "o/ds-000007.scores.parquet"
    written, scored = batches.scored_shard({"work": "w", "out": "o", "dataset": "ds"}, "000007")
    assert written == paths and scored == batches.score_paths("w", "o", "ds", "000007")
    assert scored["manifest"] == "w/embed/shards/ds-000007.manifest.parquet" != paths["manifest"]


def test_the_fingerprint_follows_contents_part_files_settings_and_code(tmp_path):
    ranges, part = tmp_path / "s.ranges.json", tmp_path / "p.tar"
    ranges.write_text("[[1, 2]]")
    part.write_bytes(b"x" * 10)
    base = batches.fingerprint([ranges], [part], {"resize": 1}, "code")
    assert batches.fingerprint([ranges], [part], {"resize": 1}, "code") == base
    assert batches.fingerprint([ranges], [part], {"resize": 2}, "code") != base
    assert batches.fingerprint([ranges], [part], {"resize": 1}, "other code") != base
    os.utime(ranges, ns=(1, 1))  # a plan file rewritten with the same contents: the same shard
    assert batches.fingerprint([ranges], [part], {"resize": 1}, "code") == base
    ranges.write_text("[[1, 3]]")
    changed = batches.fingerprint([ranges], [part], {"resize": 1}, "code")
    assert changed != base
    os.utime(part, ns=(1, 1))  # a part written again: its shards are written again
    assert batches.fingerprint([ranges], [part], {"resize": 1}, "code") != changed


def test_a_shard_is_kept_only_when_committed_with_the_same_fingerprint_and_all_its_files_there(tmp_path):
    record, tar = str(tmp_path / "s.written"), tmp_path / "s.tar"
    tar.write_bytes(b"t")
    assert not batches.is_written(record, "fp", [tar])  # never committed (killed before its record)
    batches.mark_written(record, "fp")
    assert batches.is_written(record, "fp", [tar])
    assert not batches.is_written(record, "other", [tar])
    tar.unlink()
    assert not batches.is_written(record, "fp", [tar])
    batches.forget_written(record)
    assert not os.path.exists(record)


def test_the_code_digest_changes_with_a_script(tmp_path):
    script = tmp_path / "write_shard.py"
    script.write_text("print(1)\n")
    first = batches.code_digest([script])
    assert batches.code_digest([script]) == first
    script.write_text("print(2)\n")
    assert batches.code_digest([script]) != first


def test_a_batch_writes_what_is_not_committed_and_a_write_that_dies_leaves_no_record(tmp_path):
    def work(fp, wrote, fail=None):
        for s in ("000000", "000001"):
            f = tmp_path / f"{s}.tar"

            def write(s=s, f=f):
                if s == fail:
                    raise RuntimeError("killed")
                f.write_text(fp)
                wrote.append(s)

            yield batches.ShardWork(s, str(tmp_path / f"{s}.written"), fp, [str(f)], write)

    wrote = []
    assert batches.write_batch(work("a", wrote), tmp_path / "b.json") == {"written": ["000000", "000001"], "kept": []}
    assert batches.write_batch(work("a", wrote), tmp_path / "b.json") == {"written": [], "kept": ["000000", "000001"]}
    assert wrote == ["000000", "000001"]
    with pytest.raises(RuntimeError):  # new inputs; the job dies on the second shard
        batches.write_batch(work("b", wrote, fail="000001"), tmp_path / "b.json")
    assert (tmp_path / "000000.written").read_text() == "b" and not (tmp_path / "000001.written").exists()
    assert batches.write_batch(work("b", wrote), tmp_path / "b.json") == {"written": ["000001"], "kept": ["000000"]}
