"""Planning per key bucket (shardsmith.shards.buckets): the same shards and ledger with one bucket or many, every
sample published or in the ledger, shards from per-part counts, a torn or short bucket file refused."""

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from shardsmith.formats.shuffle import read_bucket
from shardsmith.formats.tables import key_bins, key_digest_sum
from shardsmith.shards import buckets as bucket_module
from shardsmith.shards.buckets import EXCLUDED, KEYS, shard_ranges, split_exclusions
from shardsmith.shards.validate import planned_keys
from tests.shards.reference import plan_in_process


def parts(tmp_path, rng, n_parts: int = 6) -> tuple[list[str], list[str], str]:
    """Parts with keys repeated across them, and an exclusion table naming some keys (one twice)."""
    pool = [f"k{i:03d}" for i in range(150)]
    paths, ids = [], []
    for p in range(n_parts):
        keys = [str(k) for k in rng.choice(pool, size=int(rng.integers(0, 60)), replace=False)]
        df = pd.DataFrame({"key": keys, "source": "web", "source_id": [f"web/{p}/{k}" for k in keys], "url": ""})
        path = tmp_path / f"web-{p:06d}.samples.parquet"
        df.to_parquet(path, index=False)
        paths.append(str(path))
        ids.append(f"web-{p:06d}")
    excluded = [str(k) for k in rng.choice(pool, size=20, replace=False)]
    rows = [{"key": k, "stage": "embed", "reason": "low_similarity", "detail": f"d{k}"} for k in excluded]
    rows.append({**rows[0], "detail": "a later row: ignored"})
    ex = tmp_path / "excluded.parquet"
    pd.DataFrame(rows).to_parquet(ex, index=False)
    return paths, ids, str(ex)


def plan_files(out) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


@pytest.mark.parametrize("seed", [0, 1])
def test_the_same_shards_and_ledger_with_one_bucket_or_many_and_every_sample_accounted_for(tmp_path, seed):
    paths, ids, ex = parts(tmp_path, np.random.default_rng(seed))
    got = {}
    for buckets in (1, 4, 13):
        out = tmp_path / f"plan-{buckets}"
        plan_in_process(paths, ids, "ds", 25, out, exclusions=[ex], buckets=buckets)
        got[buckets] = plan_files(out)
    assert got[1] == got[4] == got[13]  # byte for byte
    out = tmp_path / "plan-1"
    planned = [pd.read_parquet(out / n) for n in sorted(got[1]) if n.endswith(".samples.parquet")]
    dropped = pd.read_parquet(out / "dropped.parquet")
    total = sum(len(pd.read_parquet(p)) for p in paths)
    assert sum(map(len, planned)) + len(dropped) == total
    published = pd.concat(planned)["key"]
    assert published.is_unique  # every key once
    assert all(len(p) == 25 for p in planned[:-1])
    first = dropped[dropped["reason"] == "low_similarity"]
    assert not first.empty and "ignored" not in " ".join(first["detail"])


@pytest.mark.parametrize("files", [1, 3, 512])
def test_exclusions_spilled_in_fewer_files_than_buckets_land_each_in_its_bucket_in_table_order(
    tmp_path, monkeypatch, files
):
    """At LAION-5B's 62,400 buckets a file per bucket would pass any open-files limit: the spill keeps at most
    SPILL_FILES, each a run of consecutive buckets, and every bucket's batch still holds its rows in order."""
    monkeypatch.setattr(bucket_module, "SPILL_FILES", files)
    _, _, ex = parts(tmp_path, np.random.default_rng(2))
    out = tmp_path / "excluded.arrow"
    assert split_exclusions([ex, ex], 13, out, str(tmp_path / "scratch")) == 42
    rows = pd.concat([pd.read_parquet(ex)] * 2, ignore_index=True).assign(id=np.arange(-42, 0))
    rows["bucket"] = key_bins(pa.array(rows["key"]), 13)
    for b in range(13):
        got = read_bucket(out, b, EXCLUDED).to_pandas()
        want = rows[rows["bucket"] == b]
        assert got["key"].tolist() == want["key"].tolist() and got["id"].tolist() == want["id"].tolist(), b
    assert not list((tmp_path / "scratch").iterdir())  # the spill folder is gone


def test_shard_ranges_cut_the_kept_samples_in_order_and_name_the_rows_left_out_between():
    dropped = {"a": np.array([1, 6]), "c": np.array([0])}
    assert shard_ranges([("a", 7), ("b", 0), ("c", 8)], 4, dropped) == [
        [("a", 0, 5, [1])],  # rows 0, 2, 3, 4
        [("a", 5, 6, []), ("c", 1, 4, [])],  # row 5 (6 is left out), then c's 1-3
        [("c", 4, 8, [])],
    ]
    assert shard_ranges([("a", 0)], 4) == []
    # a shard's ranges depend on its parts alone: a later part that changes leaves them as they were
    grown = shard_ranges([("a", 7), ("b", 0), ("c", 8), ("d", 9)], 4, dropped)
    assert grown[:3] == shard_ranges([("a", 7), ("b", 0), ("c", 8)], 4, dropped)


def test_a_bucket_file_with_fewer_batches_is_refused_with_what_to_do(tmp_path):
    paths, ids, ex = parts(tmp_path, np.random.default_rng(3), n_parts=1)
    from shardsmith.shards.buckets import split_keys

    split_keys([paths[0]], 0, 2, tmp_path / "k.arrow")
    assert read_bucket(tmp_path / "k.arrow", 1, KEYS).num_rows >= 0
    with pytest.raises(ValueError, match="make it again"):
        read_bucket(tmp_path / "k.arrow", 2, KEYS)


def test_the_shard_list_names_its_parts_and_ranges(tmp_path):
    paths, ids, _ = parts(tmp_path, np.random.default_rng(4), n_parts=3)
    names = plan_in_process(paths, ids, "ds", 40, tmp_path / "plan", buckets=2)
    for name in names:
        ranges = json.loads((tmp_path / "plan" / f"{name}.ranges.json").read_text())
        listed = (tmp_path / "plan" / f"{name}.parts").read_text().split()
        assert listed == list(dict.fromkeys(r[0] for r in ranges))
        rows = pd.read_parquet(tmp_path / "plan" / f"{name}.samples.parquet")
        assert len(rows) == sum(end - first - len(gone) for _, first, end, gone in ranges)
        assert list(dict.fromkeys(rows["part"])) == listed


@pytest.mark.parametrize("buckets", [1, 4, 13])
def test_the_buckets_record_exactly_the_keys_the_shards_get(tmp_path, buckets):
    """Each bucket job's footer holds the count and digest sum of the keys it keeps; summed over the buckets
    they are the planned shards' keys, which validate_dataset checks the written shards against."""
    paths, ids, ex = parts(tmp_path, np.random.default_rng(2))
    work = tmp_path / f"b{buckets}"
    work.mkdir()
    keys = [str(work / f"{i}.keys.arrow") for i in range(len(paths))]
    for i, (path, out) in enumerate(zip(paths, keys, strict=True)):
        bucket_module.split_keys([path], i, buckets, out)
    split_exclusions([ex], buckets, work / "excluded.arrow", tmp=str(work))
    drops = [str(work / f"{b}.drops.arrow") for b in range(buckets)]
    for b, out in enumerate(drops):
        bucket_module.find_duplicate_keys(keys, str(work / "excluded.arrow"), b, 1, out)
    plan_in_process(paths, ids, "ds", 25, tmp_path / "plan", exclusions=[ex], buckets=buckets)
    shards = sorted((tmp_path / "plan").glob("*.samples.parquet"))
    published = pd.concat([pd.read_parquet(p) for p in shards])["key"].tolist()
    assert planned_keys(drops, None) == (len(published), key_digest_sum(published))
    assert planned_keys(drops, None) != (len(published), key_digest_sum(published[1:] + published[:1] * 2))


def test_a_bucket_that_kept_a_key_twice_stops_the_plan():
    keys = pa.table({"key": ["a", "b", "a"], "id": [0, 1, 2], "source_id": ["x", "y", "z"]})
    assert bucket_module.kept_keys(keys, np.array([2]), 0) == {"kept": 2, "key_sum": key_digest_sum(["a", "b"])}
    with pytest.raises(RuntimeError, match="bucket 5: a key stays more than once"):
        bucket_module.kept_keys(keys, np.array([1]), 5)
