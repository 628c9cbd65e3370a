"""The index files (shardsmith.formats.index): sizes.json, wids-index.json, manifest.parquet, rejected.parquet and
stats.json from built shards, and a ledger that must add up."""

import hashlib
import json
import os

import pandas as pd
import pyarrow.parquet as pq
import pytest

from shardsmith.core.ledger import REJECT_COLUMNS
from shardsmith.formats.index import (
    MANIFEST_COLUMNS,
    LedgerMismatch,
    build_index,
    rejected_by_source,
    write_scored_manifest_piece,
)
from tests.shards.test_plan import EXPECTED_KEYS, index_args, make_built


@pytest.fixture
def built(tmp_path):
    return make_built(tmp_path)


def test_build_index_writes_index_files_that_add_up(built):
    out = built["out"]
    stats = build_index(**index_args(built))
    assert json.loads((out / "sizes.json").read_text()) == {f"{n}.tar": 4 for n in built["names"]}
    wids = json.loads((out / "wids-index.json").read_text())
    assert wids["__kind__"] == "wids-shard-index-v1" and wids["name"] == "ds"
    for entry, n in zip(wids["shardlist"], built["names"], strict=True):
        data = (out / f"{n}.tar").read_bytes()
        assert entry == {
            "url": f"{n}.tar",
            "nsamples": 4,
            "md5sum": hashlib.md5(data).hexdigest(),
            "filesize": len(data),
        }
    manifest = pd.read_parquet(out / "manifest.parquet")
    assert list(manifest.columns) == MANIFEST_COLUMNS
    assert list(manifest["key"]) == EXPECTED_KEYS
    assert list(manifest["shard"]) == [f"ds-00000{i // 4}.tar" for i in range(12)]
    rejected = pd.read_parquet(out / "rejected.parquet")
    assert list(rejected.columns) == REJECT_COLUMNS and len(rejected) == 4
    assert stats == json.loads((out / "stats.json").read_text())
    assert stats["input_records"] == 16 == stats["published"] + stats["rejected"]
    assert (stats["published"], stats["rejected"], stats["shards"]) == (12, 4, 3)
    assert stats["rejected_by_stage"] == {"download": 3, "shard": 1}
    assert stats["rejected_by_reason"] == {"download/no_url": 3, "shard/duplicate_key": 1}
    assert stats["published_by_source"] == {"src": 12}
    assert stats["rejected_by_source"] == {"src": 4}  # the card's per-source table, without reading the ledger
    assert rejected_by_source(out / "rejected.parquet") == stats["rejected_by_source"]  # for an older stats.json
    assert stats["bytes"] == sum(i["filesize"] for i in built["infos"])


def test_scored_pieces_give_a_manifest_with_the_score_columns_matched_by_key(built, tmp_path):
    """Each shard's score table (in another order, one sample without a row) joined to its piece by key; the
    manifest folder keeps the scored pieces' bytes (hard-linked) and reads as one table."""
    args = index_args(built)
    scored = []
    for i, piece in enumerate(args["manifest_pieces"]):
        keys = pq.read_table(piece, columns=["key"]).column("key").to_pylist()
        table = pd.DataFrame({"key": keys[::-1], "clip_similarity_score": [0.1 * k for k in range(len(keys))],
                              "aesthetic_score": [5.0 + k for k in range(len(keys))]})  # fmt: skip
        if i == 1:
            table = table.iloc[1:]  # the last sample of the shard has no score row
        table.to_parquet(tmp_path / f"{i}.scores.parquet", index=False)
        scored.append(str(tmp_path / f"{i}.manifest.parquet"))
        assert write_scored_manifest_piece(piece, tmp_path / f"{i}.scores.parquet", scored[-1]) == len(keys)
    build_index(**{**args, "manifest_pieces": scored})
    manifest = pd.read_parquet(built["out"] / "manifest.parquet")
    assert list(manifest.columns) == [*MANIFEST_COLUMNS, "clip_similarity_score", "aesthetic_score"]
    assert list(manifest["key"]) == EXPECTED_KEYS
    first = manifest[manifest["shard"] == "ds-000000.tar"]
    assert first["aesthetic_score"].tolist() == [8.0, 7.0, 6.0, 5.0]  # matched by key, not by position
    second = manifest[manifest["shard"] == "ds-000001.tar"]
    assert second["aesthetic_score"].isna().tolist() == [False, False, False, True]
    assert str(manifest["clip_similarity_score"].dtype) == "float32"
    piece = built["out"] / "manifest.parquet" / "ds-000000.parquet"
    assert os.stat(piece).st_ino == os.stat(scored[0]).st_ino  # linked, not rewritten
    pd.DataFrame({"key": ["a"], "url": [0.5]}).to_parquet(tmp_path / "clash.parquet", index=False)
    with pytest.raises(ValueError, match=r"score columns \['url'\] are manifest columns already"):
        write_scored_manifest_piece(args["manifest_pieces"][0], tmp_path / "clash.parquet", tmp_path / "x.parquet")
    assert not (tmp_path / "x.parquet").exists()


def test_build_index_refuses_a_status_row_without_outcome(built, tmp_path):
    extra = tmp_path / "extra.status.parquet"
    pd.DataFrame({"rid": [0]}).to_parquet(extra)
    args = index_args(built)
    with pytest.raises(LedgerMismatch, match="17 input records != 12 published \\+ 4 rejected"):
        build_index(**{**args, "status_paths": [*args["status_paths"], str(extra)]})
    assert not (built["out"] / "stats.json").exists()


def test_build_index_refuses_shards_that_disagree_with_their_plans(built):
    args = index_args(built)
    with pytest.raises(LedgerMismatch, match="shards hold 8 samples"):
        build_index(**{**args, "shard_infos": args["shard_infos"][:2]})


def test_the_manifest_and_the_ledger_are_folders_of_the_pieces_linked_not_read(built):
    """A file per shard and per ledger piece with rows, in order; the jobs' pieces are linked (the index job
    never reads a manifest row), a planning piece with the shards' `id` column rewritten without it."""
    out, args = built["out"], index_args(built)
    empty = built["work"] / "empty.rejected.parquet"
    pd.DataFrame(columns=REJECT_COLUMNS).to_parquet(empty)
    build_index(**{**args, "rejected_paths": [str(empty), *args["rejected_paths"], str(empty)]})
    pieces = sorted(p.name for p in (out / "manifest.parquet").iterdir())
    assert pieces == [f"{n}.parquet" for n in built["names"]]
    for n, piece in zip(built["names"], args["manifest_pieces"], strict=True):
        assert (out / "manifest.parquet" / f"{n}.parquet").stat().st_ino == os.stat(piece).st_ino
    with_rows = [p for p in args["rejected_paths"] if len(pd.read_parquet(p))]
    ledger = sorted((out / "rejected.parquet").iterdir())
    assert [p.name for p in ledger] == [f"{i:06d}.parquet" for i in range(len(with_rows))]  # no empty piece
    for got, want in zip(ledger, with_rows, strict=True):
        assert pd.read_parquet(got).equals(pd.read_parquet(want, columns=REJECT_COLUMNS))
        assert pq.read_schema(got).names == REJECT_COLUMNS  # the planning piece's `id` is not published
    again = build_index(**args)  # the same without the empty pieces: the same files
    assert sorted(p.name for p in (out / "rejected.parquet").iterdir()) == [p.name for p in ledger]
    assert again["rejected"] == 4
