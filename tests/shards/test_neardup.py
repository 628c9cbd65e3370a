"""Which sample of a near-duplicate group is kept: published first, then the largest image, then the earliest
record; every sample left out is within the threshold of the one it names (no chains); other stages'
exclusions keep nothing out; ledger details and counts."""

import json

import numpy as np
import pandas as pd
import pytest

from shardsmith.core.errors import ConfigError
from shardsmith.shards.buckets import LEDGER_PIECE, piece_counts
from shardsmith.shards.neardecide import NEAR_COLUMNS, describe
from shardsmith.shards.neardup import NearSettings, find_near_duplicates

BASE = 0x0F0F_0F0F_0F0F_0F0F


def flip(code: int, *bits: int) -> str:
    for b in bits:
        code ^= 1 << b
    return f"{code:016x}"


def part(tmp_path, name: str, rows: list[tuple]) -> str:
    """A part's samples table: (key, source_id, width, height, phash) rows; mirrors far from everything."""
    df = pd.DataFrame(rows, columns=["key", "source_id", "width_before", "height_before", "phash"])
    df["phash_mirror"] = [f"{(int(h, 16) ^ 0xFFFF_FFFF_0000_0000):016x}" for h in df["phash"]]
    path = tmp_path / f"{name}.samples.parquet"
    df.to_parquet(path, index=False)
    return str(path)


def run(tmp_path, parts: dict[str, list[tuple]], **kw) -> pd.DataFrame:
    paths = [part(tmp_path, name, rows) for name, rows in parts.items()]
    near, _ = find_near_duplicates(paths, list(parts), NearSettings(**kw.pop("settings", {})), **kw)
    return near


def test_the_largest_image_is_kept_then_the_earliest_record(tmp_path):
    near = run(
        tmp_path,
        {
            "p0": [("a", "s:a", 400, 300, flip(BASE)), ("b", "s:b", 800, 600, flip(BASE, 1, 2))],
            "p1": [("c", "s:c", 800, 600, flip(BASE, 3)), ("d", "s:d", 100, 100, flip(~BASE & (2**64 - 1)))],
        },
    )
    assert list(near.columns) == NEAR_COLUMNS
    # b and c are the largest; b is the earlier record: it keeps a and c out, d is no copy (rows in dataset order)
    assert near[["key", "kept_key", "signal"]].values.tolist() == [["a", "b", "phash"], ["c", "b", "phash"]]
    assert near["distance"].tolist() == [2, 3]
    assert near["part"].tolist() == ["p0", "p1"] and set(near["kept_part"]) == {"p0"}


def test_a_sample_left_out_is_near_the_kept_one_itself_not_through_a_chain(tmp_path):
    a, b, c = flip(BASE), flip(BASE, 1, 2, 3, 4), flip(BASE, 1, 2, 3, 4, 5, 6, 7, 8)  # a-b 4, b-c 4, a-c 8
    near = run(tmp_path, {"p0": [("a", "s:a", 900, 900, a), ("b", "s:b", 800, 800, b), ("c", "s:c", 700, 700, c)]},
               settings={"phash_max_distance": 6})  # fmt: skip
    assert near[["key", "kept_key"]].values.tolist() == [["b", "a"]]  # c is 8 from a: kept, not chained out via b


def test_published_samples_are_kept_first_and_never_left_out(tmp_path):
    published = pd.DataFrame(
        {
            "version": ["v1", "v1"], "key": ["old", "gone"], "source_id": ["s:old", "s:gone"],
            "url": ["", ""], "sha256": ["x", "y"], "width_before": [50, 60], "height_before": [50, 60],
            "phash": [flip(BASE), flip(BASE ^ (0xFF << 8))], "phash_mirror": ["0" * 16, "0" * 16],
        }
    )  # fmt: skip
    near = run(
        tmp_path,
        {
            "p0": [
                ("old", "s:old", 50, 50, flip(BASE)),  # published in v1, still in the source, small
                ("big", "s:big", 4000, 3000, flip(BASE, 5)),  # new and large: still left out for the published one
                ("copy", "s:copy", 4000, 3000, flip(BASE ^ (0xFF << 8), 1)),  # near one no longer in the source
            ]
        },
        published=published,
    )
    got = near.set_index("key")
    assert got.loc["big", "kept_key"] == "old" and got.loc["big", "kept_version"] == "v1"
    assert got.loc["copy", "kept_key"] == "gone" and got.loc["copy", "kept_part"] == ""
    assert "old" not in got.index
    detail = describe(got.loc["copy"].to_dict())
    assert detail == "near-duplicate of gone (published in v1): pHash distance 1 of 64 bits"


def test_samples_left_out_by_another_stage_keep_nothing_out(tmp_path):
    rows = [("a", "s:a", 900, 900, flip(BASE)), ("b", "s:b", 100, 100, flip(BASE, 1))]
    assert run(tmp_path, {"p0": rows})["key"].tolist() == ["b"]
    assert run(tmp_path, {"p0": rows}, excluded={"a"}).empty


def test_mirror_hashes_pair_a_mirrored_copy(tmp_path):
    paths = [part(tmp_path, "p0", [("a", "s:a", 9, 9, flip(BASE)), ("m", "s:m", 8, 8, flip(~BASE & (2**64 - 1)))])]
    df = pd.read_parquet(paths[0])
    df.loc[1, "phash_mirror"] = flip(BASE, 2)  # m's mirror image hashes like a
    df.to_parquet(paths[0], index=False)
    near, compared = find_near_duplicates(paths, ["p0"], NearSettings())
    assert near[["key", "kept_key", "distance"]].values.tolist() == [["m", "a", 1]] and compared == 2


def test_exclusion_rows_and_counts(tmp_path):
    rows = [(k, f"s:{k}", 10 - i, 10, flip(BASE, *range(i))) for i, k in enumerate("abc")] + [
        ("x", "s:x", 5, 5, flip(~BASE & (2**64 - 1))),
        ("y", "s:y", 4, 4, flip(~BASE & (2**64 - 1), 60)),
    ]
    paths = [part(tmp_path, "p0", rows)]
    near, _ = find_near_duplicates(paths, ["p0"], NearSettings(near="exclude"), out_dir=str(tmp_path / "out"))
    piece = pd.read_parquet(tmp_path / "out" / "near_dropped.parquet")
    assert list(piece.columns) == LEDGER_PIECE and piece["key"].tolist() == near["key"].tolist() == ["b", "c", "y"]
    assert set(piece["stage"]) == {"dedupe"} and set(piece["reason"]) == {"near_duplicate"}
    assert piece["detail"].iloc[0] == "near-duplicate of a: pHash distance 1 of 64 bits"
    assert piece_counts(tmp_path / "out" / "near_dropped.parquet") == {"p0": [0, 3]}
    counts = json.loads((tmp_path / "out" / "near_duplicates.json").read_text())
    assert {k: v for k, v in counts.items() if k != "settings"} == {
        "samples_compared": 5, "groups": 2, "near_duplicates": 3, "samples_in_groups": 5,
        "distances": {"phash": {"1": 2, "2": 1}},
    }  # fmt: skip


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"near": "drop"}, "dedupe.near must be one of report, exclude, off"),
        ({"phash_max_distance": 40}, "dedupe.phash_max_distance must be in 0..32"),
        ({"embedding_min_similarity": 1.5}, "dedupe.embedding_min_similarity must be in (0, 1]"),
    ],
)
def test_bad_settings_are_one_line_config_errors(kw, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        NearSettings(**kw)


def test_no_samples_no_pairs(tmp_path):
    near, compared = find_near_duplicates([], [], NearSettings())
    assert near.empty and compared == 0
    assert np.array_equal(near.columns, NEAR_COLUMNS)


def test_many_copies_of_one_image_are_one_search_row_and_all_go_out(tmp_path):
    """A placeholder image served for a thousand URLs: each copy is left out for the kept one (distance 0),
    and when a better sample is near them, all of them for that one, at the distance of their hash."""
    copies = [(f"c{i:04d}", f"s:c{i}", 100, 100, flip(BASE)) for i in range(1000)]
    near = run(tmp_path, {"p0": copies})
    assert len(near) == 999 and set(near["kept_key"]) == {"c0000"} and set(near["distance"]) == {0}
    near = run(tmp_path, {"p0": copies, "p1": [("big", "s:big", 900, 900, flip(BASE, 7))]})
    assert len(near) == 1000 and set(near["kept_key"]) == {"big"} and set(near["distance"]) == {1}


def test_embeddings_pair_samples_of_any_part_beside_published_ones(tmp_path):
    """The semantic signal reads each part's embeddings (rows as in its samples table) while published
    samples no longer in the build sit among the candidates too."""
    rng = np.random.default_rng(0)
    far = [flip(int(x)) for x in rng.integers(0, 2**63, 5)]  # hashes that pair nothing
    parts = {"p0": [("a", "s:a", 900, 900, far[0]), ("b", "s:b", 800, 800, far[1])],
             "p1": [("c", "s:c", 700, 700, far[2]), ("d", "s:d", 600, 600, far[3])]}  # fmt: skip
    paths = [part(tmp_path, name, rows) for name, rows in parts.items()]
    vectors = rng.normal(size=(4, 16))
    vectors[3] = vectors[1] + 0.01  # d is b's copy, for the model
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    npz = []
    for name, rows in parts.items():
        i = [0, 1] if name == "p0" else [2, 3]
        npz.append(str(tmp_path / f"{name}.npz"))
        np.savez(npz[-1], key=np.array([r[0] for r in rows]), image=vectors[i].astype(np.float16))
    published = pd.DataFrame(
        {
            "version": ["v1"],
            "key": ["gone"],
            "source_id": ["s:gone"],
            "url": [""],
            "sha256": ["x"],
            "width_before": [10],
            "height_before": [10],
            "phash": [far[4]],
            "phash_mirror": ["0" * 16],
        }
    )
    near, compared = find_near_duplicates(
        paths, list(parts), NearSettings(embedding_min_similarity=0.99), published=published, embedding_paths=npz
    )
    assert near[["key", "kept_key", "signal"]].values.tolist() == [["d", "b", "embedding"]] and compared == 4
    assert near["distance"].iloc[0] == pytest.approx(float(vectors[1] @ vectors[3]), abs=2e-3)


@pytest.mark.parametrize(
    ("units", "buckets_per_job", "groups_per_job"),
    [(1, 16, 4), (8_000, 16, 16), (62_400, 125, 125), (3_072, 16, 7)],
)
def test_auto_slices_keep_a_planning_step_near_500_jobs(units, buckets_per_job, groups_per_job):
    s = NearSettings()
    assert s.buckets_in_a_job(units) == buckets_per_job and s.groups_in_a_job(units) == groups_per_job
    assert -(-units // s.buckets_in_a_job(units)) <= 500 and -(-units // s.groups_in_a_job(units)) <= 500
    assert NearSettings(buckets_per_job=3, groups_per_job=2).buckets_in_a_job(62_400) == 3


@pytest.mark.parametrize("bad", [0, "many", True, 1.5])
def test_a_bad_slice_setting_is_named(bad):
    with pytest.raises(ConfigError, match="dedupe.groups_per_job must be a positive number or auto"):
        NearSettings(groups_per_job=bad)
