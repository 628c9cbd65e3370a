"""Shard planning (shardsmith.shards.plan.plan_shards, the last of the planning jobs; the jobs before it run in
order by tests.shards.reference): uniform shards in input order from each part's count and the rows left out,
duplicates and exclusions to the ledger, streamed planning in bounded memory, the order of the dataset-wide
steps."""

import json
import tarfile
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from shardsmith.core.atomic import atomic_open
from shardsmith.core.ledger import REJECT_COLUMNS
from shardsmith.formats.parts import SAMPLE_COLUMNS
from shardsmith.formats.tario import ShardWriter
from shardsmith.shards.buckets import write_ledger_piece
from shardsmith.shards.neardup import NearSettings
from shardsmith.shards.plan import plan_shards
from shardsmith.shards.sampleid import sample_ids
from shardsmith.shards.write import write_shard
from tests.shards.reference import plan_dataset, plan_in_process


def members_of(key: str) -> dict[str, bytes]:
    return {
        "jpg": f"jpeg of {key}".encode(),
        "txt": f"caption {key}".encode(),
        "json": json.dumps({"key": key}).encode(),
    }


def make_part(work, part: str, keys: list[str], rejected: int = 0) -> dict:
    """A processed part (tar + samples table + rejected table) and its download status, built directly."""
    tar, samples = work / f"{part}.tar", []
    with atomic_open(tar) as f, ShardWriter(f) as w:
        for i, key in enumerate(keys):
            where = w.write(key, members_of(key))
            samples.append(
                {
                    "key": key, "source": "src", "source_id": f"{part}:{i}", "url": f"{key}.jpg",
                    "width_before": 64, "height_before": 48, "width": 64, "height": 48, "bytes": where["jpg"][1],
                    "sha256": "0" * 64, "caption_length": 9, "caption_field": "txt", "passthrough": i % 2 == 0,
                    **{f"{e}_{n}": v for e, (off, size) in where.items() for n, v in (("offset", off), ("size", size))},
                }
            )  # fmt: skip
    paths = {"tar": str(tar), "samples": str(work / f"{part}.samples.parquet")}
    pd.DataFrame(samples, columns=SAMPLE_COLUMNS).to_parquet(paths["samples"])
    rej = [
        {
            "source": "src",
            "source_id": f"{part}:bad{i}",
            "url": "",
            "key": "",
            "stage": "download",
            "reason": "no_url",
            "detail": "",
        }
        for i in range(rejected)
    ]
    paths["rejected"] = str(work / f"{part}.rejected.parquet")
    pd.DataFrame(rej, columns=REJECT_COLUMNS).to_parquet(paths["rejected"])
    paths["status"] = str(work / f"{part}.status.parquet")
    pd.DataFrame({"rid": range(len(keys) + rejected)}).to_parquet(paths["status"])
    return paths


@pytest.fixture
def built(tmp_path):
    return make_built(tmp_path)


def make_built(tmp_path) -> dict:
    """Three parts (the second repeats a key of the first), planned into shards of 4 and written."""
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    parts = {
        "src-000000": make_part(work, "src-000000", [f"a{i}" for i in range(5)], rejected=2),
        "src-000001": make_part(work, "src-000001", ["b0", "a1", "b1", "b2", "b3"]),
        "src-000002": make_part(work, "src-000002", ["c0", "c1", "c2"], rejected=1),
    }
    names = plan_in_process([p["samples"] for p in parts.values()], list(parts), "ds", 4, work / "plan")
    infos = [
        write_shard(
            str(work / "plan" / f"{n}.samples.parquet"),
            {k: p["tar"] for k, p in parts.items()},
            str(out / f"{n}.tar"),
            str(work / f"{n}.info.json"),
            out_manifest=str(work / f"{n}.manifest.parquet"),
        )
        for n in names
    ]
    return {"work": work, "out": out, "parts": parts, "names": names, "infos": infos}


def tar_members(path) -> list[tuple[str, bytes]]:
    with tarfile.open(path) as tar:
        return [(m.name, tar.extractfile(m).read()) for m in tar]


def index_args(b: dict, **override) -> dict:
    args = {
        "dataset": "ds",
        "shard_infos": [str(b["work"] / f"{n}.info.json") for n in b["names"]],
        "manifest_pieces": [str(b["work"] / f"{n}.manifest.parquet") for n in b["names"]],
        "status_paths": [p["status"] for p in b["parts"].values()],
        "rejected_paths": [
            *(p["rejected"] for p in b["parts"].values()),
            str(b["work"] / "plan" / "dropped.parquet"),
        ],
        "out_dir": b["out"],
    }
    return {**args, **override}


EXPECTED_KEYS = [*(f"a{i}" for i in range(5)), "b0", "b1", "b2", "b3", "c0", "c1", "c2"]


def test_plan_shards_makes_uniform_shards_in_input_order(built):
    plan = built["work"] / "plan"
    assert built["names"] == ["ds-000000", "ds-000001", "ds-000002"]
    keys = [list(pd.read_parquet(plan / f"{n}.samples.parquet")["key"]) for n in built["names"]]
    assert [len(k) for k in keys] == [4, 4, 4]
    assert sum(keys, []) == EXPECTED_KEYS


def test_plan_shards_cuts_ranges_from_the_ledger_pieces_and_copies_the_near_duplicate_tables(tmp_path):
    """The rule's step alone: each part's count and rows left out come from the pieces (a group's, then the
    near-duplicates'), a shard's ranges skip those rows, and decide_near_duplicates' tables land beside the plan."""

    def piece(name: str, ids: np.ndarray, counts: dict) -> str:
        rows = pd.DataFrame({c: ["x"] * len(ids) for c in REJECT_COLUMNS}).assign(id=ids)
        write_ledger_piece(tmp_path / name, rows, counts)
        return str(tmp_path / name)

    pieces = [piece("group.parquet", sample_ids(0, [1]), {"p0": [5, 1], "p1": [4, 0]}),
              piece("near.parquet", sample_ids(1, [2]), {"p0": [0, 0], "p1": [0, 1]})]  # fmt: skip
    found = tmp_path / "found"
    found.mkdir()
    (found / "near_duplicates.parquet").write_bytes(b"the table")
    (found / "near_duplicates.json").write_text(json.dumps({"near_duplicates": 1, "groups": 1}))
    said = []
    names = plan_shards(pieces, tmp_path / "plan", dataset="ds", samples_per_shard=3,
                        near=NearSettings(near="exclude"), found=found, log=said.append)  # fmt: skip
    plan = tmp_path / "plan"
    assert names == ["ds-000000", "ds-000001", "ds-000002"]
    ranges = [json.loads((plan / f"{n}.ranges.json").read_text()) for n in names]
    assert ranges == [[["p0", 0, 4, [1]]], [["p0", 4, 5, []], ["p1", 0, 2, []]], [["p1", 3, 4, []]]]
    assert [(plan / f"{n}.parts").read_text().split() for n in names] == [["p0"], ["p0", "p1"], ["p1"]]
    assert (plan / "near_duplicates.parquet").read_bytes() == b"the table"
    assert said == ["near-duplicates: 1 samples in 1 groups left out", "3 shards of at most 3 samples"]


def test_plan_shards_last_shard_holds_the_remainder(tmp_path):
    part = make_part(tmp_path, "src-000000", [f"k{i}" for i in range(7)])
    names = plan_in_process([part["samples"]], ["src-000000"], "ds", 3, tmp_path / "plan")
    assert [len(pd.read_parquet(tmp_path / "plan" / f"{n}.samples.parquet")) for n in names] == [3, 3, 1]


def test_plan_shards_rejects_later_duplicate_keys_and_keeps_the_first(built):
    dupes = pd.read_parquet(built["work"] / "plan" / "dropped.parquet")
    assert list(dupes.columns) == REJECT_COLUMNS
    assert dupes.to_dict("records") == [
        {
            "source": "src",
            "source_id": "src-000001:1",
            "url": "a1.jpg",
            "key": "a1",
            "stage": "shard",
            "reason": "duplicate_key",
            "detail": "same key as src-000000:1",
        }
    ]
    first = pd.read_parquet(built["work"] / "plan" / "ds-000000.samples.parquet")
    assert first.set_index("key").loc["a1", "part"] == "src-000000"


def test_parts_files_list_the_parts_each_shard_draws_from(built):
    parts = [(built["work"] / "plan" / f"{n}.parts").read_text().split() for n in built["names"]]
    assert parts == [["src-000000"], ["src-000000", "src-000001"], ["src-000001", "src-000002"]]


def test_exclusions_go_to_the_ledger_with_their_reason_and_shards_stay_uniform(tmp_path):

    rows = [
        {c: 0 for c in SAMPLE_COLUMNS} | {"key": f"k{i}", "source": "s", "source_id": f"id{i}", "url": ""}
        for i in range(7)
    ]
    part = tmp_path / "p.samples.parquet"
    pd.DataFrame(rows).to_parquet(part)
    excl = tmp_path / "excl.parquet"
    pd.DataFrame(
        {"key": ["k1", "k4"], "stage": "embed", "reason": "low_similarity", "detail": "0.01 < 0.2"}
    ).to_parquet(excl)
    names = plan_in_process([str(part)], ["s-000000"], "ds", 2, tmp_path / "plan", exclusions=[str(excl)])
    kept = [list(pd.read_parquet(tmp_path / "plan" / f"{n}.samples.parquet")["key"]) for n in names]
    assert kept == [["k0", "k2"], ["k3", "k5"], ["k6"]]
    dropped = pd.read_parquet(tmp_path / "plan" / "dropped.parquet")
    assert list(dropped["key"]) == ["k1", "k4"] and set(dropped["reason"]) == {"low_similarity"}
    assert set(dropped["stage"]) == {"embed"} and list(dropped["source_id"]) == ["id1", "id4"]


# ---------------------------------------------------------------- streamed planning: same plan, bounded memory


def reference_plan(
    parts: dict[str, list[str]], excl: dict[str, str], per_shard: int
) -> tuple[list[list[str]], list[tuple[str, str, str]]]:
    """What planning must produce, computed the plain way: every row in memory.
    Returns the keys per shard and the dropped (source_id, reason, detail) rows in part order."""
    kept, dropped, first = [], [], {}
    for part, keys in parts.items():
        for i, key in enumerate(keys):
            sid = f"{part}:{i}"
            if key in excl:
                dropped.append((sid, "low_similarity", excl[key]))
            elif key in first:
                dropped.append((sid, "duplicate_key", f"same key as {first[key]}"))
            else:
                first[key] = sid
                kept.append(key)
    return [kept[i : i + per_shard] for i in range(0, len(kept), per_shard)], dropped


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("buckets", [1, 5])
def test_streamed_plan_matches_the_in_memory_plan(tmp_path, seed, buckets, monkeypatch):
    """Random parts with keys repeated across parts (process_part already rejects repeats within one) and
    exclusions, some of them of first occurrences; decided in one bucket and in five, each on its own. Also
    with every key hashing alike (all in one bucket)."""
    import numpy as np

    import shardsmith.formats.tables as tables_mod

    rng = np.random.default_rng(seed)
    pool = [f"k{i}" for i in range(60)]
    parts = {
        f"src-{p:06d}": [str(k) for k in rng.choice(pool, size=int(rng.integers(0, 25)), replace=False)]
        for p in range(5)
    }
    excl = {str(k): f"{float(rng.random()):.3f} < 0.2" for k in rng.choice(pool, size=12, replace=False)}
    for part, keys in parts.items():
        make_part(tmp_path, part, keys)
    ex = tmp_path / "excl.parquet"
    # a key listed twice: the first row's reason is the one that counts
    rows = [{"key": k, "stage": "embed", "reason": "low_similarity", "detail": d} for k, d in excl.items()]
    rows.append({**rows[0], "detail": "a later, ignored row"})
    pd.DataFrame(rows).to_parquet(ex)
    want_shards, want_dropped = reference_plan(parts, excl, 7)

    def plan(out):
        names = plan_in_process(
            [str(tmp_path / f"{p}.samples.parquet") for p in parts],
            list(parts),
            "ds",
            7,
            out,
            exclusions=[str(ex)],
            buckets=buckets,
        )
        shards = [list(pd.read_parquet(out / f"{n}.samples.parquet")["key"]) for n in names]
        dropped = pd.read_parquet(out / "dropped.parquet")
        return shards, [(r["source_id"], r["reason"], r["detail"]) for r in dropped.to_dict("records")]

    assert plan(tmp_path / "plan") == (want_shards, want_dropped)
    monkeypatch.setattr(tables_mod, "key_hashes", lambda keys: np.zeros(len(keys), dtype=np.uint64))
    assert plan(tmp_path / "plan-colliding") == (want_shards, want_dropped)
    assert not list(tmp_path.glob(".spill-*"))  # the bins are cleaned up


def test_plan_shards_memory_does_not_grow_with_the_rows_held(tmp_path, monkeypatch):
    """Traced Python/numpy memory of planning 8x the samples (same part size, keys in bins of 4000 on
    disk) stays flat, where holding the rows cost ~100 B a sample of it (and ~420 B of RSS).
    bench/memory_scale.py measures RSS at up to 1.6M samples."""
    import tempfile
    import tracemalloc

    import shardsmith.formats.tables as tables_mod

    monkeypatch.setattr(tables_mod, "BIN_ROWS", 4000)

    def peak(n_parts: int) -> int:
        folder = Path(tempfile.mkdtemp(dir=tmp_path))
        paths = [
            make_part(folder, f"src-{p:06d}", [f"p{p}-k{i}" for i in range(2000)])["samples"] for p in range(n_parts)
        ]
        tracemalloc.start()
        plan_in_process(paths, [f"src-{p:06d}" for p in range(n_parts)], "ds", 1000, folder / "plan")
        got = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return got

    peak(4)  # first use: pandas and pyarrow set up caches that stay
    small, large = peak(4), peak(32)
    per_added_sample = (large - small) / (28 * 2000)
    assert per_added_sample < 4, per_added_sample  # a 64-bit hash per sample alone would be 8


def test_plan_shards_reads_tables_written_with_other_string_types(tmp_path):
    """Exclusion tables from other tools may use string rather than large_string, or all-null details."""
    import pyarrow as pa

    part = make_part(tmp_path, "src-000000", ["k0", "k1", "k2"])
    excl = tmp_path / "excl.parquet"
    pq.write_table(
        pa.table(
            {
                "key": pa.array(["k1"], pa.string()),
                "stage": ["embed"],
                "reason": ["low_similarity"],
                "detail": pa.nulls(1, pa.string()),
            }
        ),
        excl,
    )
    names = plan_in_process([part["samples"]], ["src-000000"], "ds", 10, tmp_path / "plan", exclusions=[str(excl)])
    assert list(pd.read_parquet(tmp_path / "plan" / f"{names[0]}.samples.parquet")["key"]) == ["k0", "k2"]
    [row] = pd.read_parquet(tmp_path / "plan" / "dropped.parquet").to_dict("records")
    assert (row["key"], row["reason"]) == ("k1", "low_similarity") and pd.isna(row["detail"])


def test_bins_a_killed_plan_left_behind_are_removed_by_the_next(tmp_path):
    part = make_part(tmp_path, "src-000000", ["k0", "k1"])
    stale = tmp_path / ".spill-killed" / "keys"
    stale.mkdir(parents=True)
    (stale / "00000.arrow").write_bytes(b"half a file")
    plan_in_process([part["samples"]], ["src-000000"], "ds", 10, tmp_path / "plan")
    assert not list(tmp_path.glob(".spill-*"))


def near_parts(work) -> dict[str, dict]:
    """Two parts whose samples all look different but for b1, a copy of a2 (its pHash one bit away)."""
    parts = {
        "src-000000": make_part(work, "src-000000", [f"a{i}" for i in range(4)]),
        "src-000001": make_part(work, "src-000001", [f"b{i}" for i in range(4)]),
    }
    rng = np.random.default_rng(7)
    codes = {k: int(c) for k, c in zip(["a0", "a1", "a2", "a3", "b0", "b1", "b2", "b3"], rng.integers(0, 2**63, 8))}
    codes["b1"] = codes["a2"] ^ 1
    for p in parts.values():
        samples = pd.read_parquet(p["samples"])
        samples["phash"] = [f"{codes[k]:016x}" for k in samples["key"]]
        samples["phash_mirror"] = [f"{(codes[k] ^ (2**64 - 1)):016x}" for k in samples["key"]]
        samples.to_parquet(p["samples"])
    return parts


@pytest.mark.parametrize("mode", ["off", "report", "exclude"])
def test_plan_dataset_finds_near_duplicates_before_it_plans_the_shards(tmp_path, mode):
    """plan_dataset's order: near-duplicates are found first, so with `exclude` the copy is left out of the shards
    (and in the ledger); `report` keeps every sample; `off` plans exactly as the exact steps alone do."""
    work = tmp_path / "work"
    work.mkdir()
    parts = near_parts(work)
    samples = [p["samples"] for p in parts.values()]
    said = []
    names = plan_dataset(
        samples, work / "plan", dataset="ds", samples_per_shard=3, exclusions=[], dedupe=None,
        near=NearSettings(near=mode), embeddings=[], log=said.append,
    )  # fmt: skip
    planned = [k for n in names for k in pd.read_parquet(work / "plan" / f"{n}.samples.parquet")["key"]]
    dropped = pd.read_parquet(work / "plan" / "dropped.parquet")
    if mode == "off":
        alone = plan_in_process(samples, list(parts), "ds", 3, tmp_path / "alone")
        assert names == alone and not [m for m in said if m.startswith("near-duplicates")]
        for n in names:
            plan = f"{n}.samples.parquet"
            assert (work / "plan" / plan).read_bytes() == (tmp_path / "alone" / plan).read_bytes()
        return
    assert json.loads((work / "plan" / "near_duplicates.json").read_text())["near_duplicates"] == 1
    assert "near-duplicates: 1 samples in 1 groups" in said[0]
    if mode == "report":
        assert sorted(planned) == sorted(f"{p}{i}" for p in "ab" for i in range(4)) and dropped.empty
    else:
        assert "b1" not in planned and len(planned) == 7
        assert dropped["key"].tolist() == ["b1"] and "near" in dropped["reason"].iloc[0]
