"""Shard planning and writing (shardsmith.shards): uniform shards in input order, duplicates and exclusions to
the ledger, byte-range copies with the same bytes, streamed planning in bounded memory."""

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from conftest import jpeg_bytes

from shardsmith.captions import CaptionSettings
from shardsmith.download import download_part
from shardsmith.index import build_index
from shardsmith.ledger import REJECT_COLUMNS
from shardsmith.parts import SAMPLE_COLUMNS
from shardsmith.process import PartProcessor
from shardsmith.rawcache import STATUS_COLUMNS
from shardsmith.resize import ResizeSettings
from shardsmith.shards import plan_shards, read_members, write_shard
from shardsmith.sources import plan_parts
from shardsmith.tario import ShardWriter, TarMember, atomic_open, read_member


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
    names = plan_shards([p["samples"] for p in parts.values()], list(parts), "ds", 4, work / "plan")
    infos = [
        write_shard(
            str(work / "plan" / f"{n}.samples.parquet"),
            {k: p["tar"] for k, p in parts.items()},
            str(out / f"{n}.tar"),
            str(work / f"{n}.info.json"),
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
        "shard_plans": [str(b["work"] / "plan" / f"{n}.samples.parquet") for n in b["names"]],
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


def test_plan_shards_last_shard_holds_the_remainder(tmp_path):
    part = make_part(tmp_path, "src-000000", [f"k{i}" for i in range(7)])
    names = plan_shards([part["samples"]], ["src-000000"], "ds", 3, tmp_path / "plan")
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


def test_write_shard_copies_the_planned_members_in_order(built):
    got = [m for n in built["names"] for m in tar_members(built["out"] / f"{n}.tar")]
    want = [(f"{k}.{e}", members_of(k)[e]) for k in EXPECTED_KEYS for e in ("jpg", "txt", "json")]
    assert got == want


def test_write_shard_info_matches_the_file(built):
    for n, info in zip(built["names"], built["infos"], strict=True):
        data = (built["out"] / f"{n}.tar").read_bytes()
        assert info == {
            "shard": f"{n}.tar", "nsamples": 4, "filesize": len(data),
            "md5sum": hashlib.md5(data).hexdigest(), "sha256": hashlib.sha256(data).hexdigest(),
        }  # fmt: skip
        assert json.loads((built["work"] / f"{n}.info.json").read_text()) == info


def per_member_shard(plan_path, part_tars) -> bytes:
    """The shard written member by member from the plan: what write_shard's range copies must equal."""
    buf = io.BytesIO()
    with ShardWriter(buf) as w:
        for row in pq.read_table(plan_path).to_pylist():
            w.write(
                row["key"],
                {
                    e: read_member(part_tars[row["part"]], row[f"{e}_offset"], row[f"{e}_size"])
                    for e in ("jpg", "txt", "json")
                },
            )
    return buf.getvalue()


def test_write_shard_copies_runs_of_samples_as_byte_ranges_with_the_same_bytes(built, tmp_path, monkeypatch):
    tars = {k: p["tar"] for k, p in built["parts"].items()}
    for n in built["names"]:  # shards across two parts, and one with a dropped duplicate (a1) between samples
        assert (built["out"] / f"{n}.tar").read_bytes() == per_member_shard(
            built["work"] / "plan" / f"{n}.samples.parquet", tars
        )
    runs = []
    real = ShardWriter.copy_samples
    monkeypatch.setattr(
        ShardWriter,
        "copy_samples",
        lambda self, src, start, end, keys: runs.append(keys) or real(self, src, start, end, keys),
    )
    n = built["names"][1]  # a4 | b0 (part 2; a1 dropped after it) | b1 b2
    write_shard(
        str(built["work"] / "plan" / f"{n}.samples.parquet"), tars, str(tmp_path / "s.tar"), str(tmp_path / "s.json")
    )
    assert runs == [["a4"], ["b0"], ["b1", "b2"]]
    assert (tmp_path / "s.tar").read_bytes() == (built["out"] / f"{n}.tar").read_bytes()


def part_from_elsewhere(tmp_path, keys: list[str]):
    """A part tar with a cls member between jpg and txt, and its plan: (part, plan)."""
    part, rows = tmp_path / "p-000000.tar", []
    with tarfile.open(part, "w", format=tarfile.USTAR_FORMAT) as tar:
        for key in keys:
            where = {}
            for ext, data in [
                ("jpg", members_of(key)["jpg"]),
                ("cls", b"3"),
                ("txt", members_of(key)["txt"]),
                ("json", members_of(key)["json"]),
            ]:
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                where[ext] = (tar.offset + tarfile.BLOCKSIZE, len(data))  # data follows its one-block header
                tar.addfile(info, io.BytesIO(data))
            rows.append(
                {
                    "key": key,
                    "part": "p-000000",
                    **{f"{e}_{n}": v for e in ("jpg", "txt", "json") for n, v in zip(("offset", "size"), where[e])},
                }
            )
    plan = tmp_path / "plan.parquet"
    pd.DataFrame(rows).to_parquet(plan)
    return part, plan


def test_write_shard_takes_samples_not_laid_out_back_to_back_member_by_member(tmp_path):
    """A part tar from elsewhere, with a cls member between jpg and txt: every sample is copied member by member."""
    part, plan = part_from_elsewhere(tmp_path, ["k0", "k1", "k2"])
    write_shard(str(plan), {"p-000000": str(part)}, str(tmp_path / "s.tar"), str(tmp_path / "s.json"))
    assert (tmp_path / "s.tar").read_bytes() == per_member_shard(plan, {"p-000000": str(part)})
    assert tar_members(tmp_path / "s.tar") == [
        (f"{k}.{e}", members_of(k)[e]) for k in ("k0", "k1", "k2") for e in ("jpg", "txt", "json")
    ]


def members_as_read(path) -> list[TarMember]:
    with tarfile.open(path) as tar:
        return [TarMember(*m.name.split(".", 1), m.offset_data, m.size) for m in tar]


def test_write_shard_records_where_every_member_landed_for_range_copies_and_member_writes(built, tmp_path):
    tars = {k: p["tar"] for k, p in built["parts"].items()}
    for n in built["names"]:  # byte ranges across parts, and a range broken by a dropped duplicate
        write_shard(
            str(built["work"] / "plan" / f"{n}.samples.parquet"),
            tars,
            str(tmp_path / "s.tar"),
            str(tmp_path / "s.json"),
            str(tmp_path / "m.parquet"),
        )
        assert read_members(tmp_path / "m.parquet") == members_as_read(tmp_path / "s.tar")
    part, plan = part_from_elsewhere(tmp_path, ["k0", "k1"])  # written member by member
    write_shard(
        str(plan),
        {"p-000000": str(part)},
        str(tmp_path / "t.tar"),
        str(tmp_path / "t.json"),
        str(tmp_path / "t.parquet"),
    )
    assert read_members(tmp_path / "t.parquet") == members_as_read(tmp_path / "t.tar")


def test_write_shard_is_byte_identical_on_rewrite(built, tmp_path):
    n = built["names"][1]
    again = tmp_path / "again.tar"
    write_shard(
        str(built["work"] / "plan" / f"{n}.samples.parquet"),
        {k: p["tar"] for k, p in built["parts"].items()},
        str(again),
        str(tmp_path / "i.json"),
    )
    assert again.read_bytes() == (built["out"] / f"{n}.tar").read_bytes()


def test_the_jobs_after_planning_run_without_pandas(built, tmp_path):
    """write_shard and write_card are on every run's critical path, and write_shard runs once per shard:
    importing pandas would add ~0.3 s to each job's start-up (validation: test_validate.py). index_shards
    gets pandas from pyarrow, whose pa.array() imports it to look for pandas objects."""
    import subprocess
    import sys

    n = built["names"][0]
    plan = str(built["work"] / "plan" / f"{n}.samples.parquet")
    parts = {k: p["tar"] for k, p in built["parts"].items()}
    out = tmp_path / "again"
    out.mkdir()
    stats = build_index(**index_args(built, out_dir=out))
    code = f"""
import sys
from shardsmith.shards import write_shard
from shardsmith.card import card_text
from shardsmith.build import build_info
info = write_shard({plan!r}, {parts!r}, {str(out / f"{n}.tar")!r}, {str(out / "info.json")!r})
stats = {stats!r}
card_text({{"dataset": "ds", "samples_per_shard": 4}}, stats, {{info["shard"]: info["nsamples"]}},
          "open_clip_train.data", versions={{}})
build_info({{"dataset": "ds"}}, "9", ".")
print(info["nsamples"], stats["published"], sorted(m for m in ("pandas", "torch", "matplotlib") if m in sys.modules))
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parents[1])
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["4", "12", "[]"]
    assert (out / f"{n}.tar").read_bytes() == (built["out"] / f"{n}.tar").read_bytes()


def test_shard_written_from_real_stages_holds_the_processed_members(tmp_path):
    """plan_parts -> download_part (resizing as it downloads) -> plan_shards -> write_shard -> build_index."""
    root = tmp_path / "photos"
    root.mkdir()
    for i in range(3):
        (root / f"p{i}.jpg").write_bytes(jpeg_bytes((80 + i, 40), (10 * i, 100, 50)))
        (root / f"p{i}.txt").write_text(f"  photo {i}  ")
    (root / "tiny.jpg").write_bytes(jpeg_bytes((8, 8)))  # rejected by min_side
    src = {"name": "photos", "type": "folder", "path": str(root)}
    w = tmp_path / "w"
    [part] = plan_parts([src], 10, w)
    processor = PartProcessor(str(w / f"{part}.tar"), ResizeSettings(), CaptionSettings())
    status = download_part(
        str(w / f"{part}.parquet"), str(w / "raw.tar"), str(w / "status.parquet"), src, processor=processor
    )
    assert list(status.columns) == STATUS_COLUMNS
    kept, rejected = processor.finish(status, str(w / "samples.parquet"), str(w / "rejected.parquet"))
    assert (kept, rejected) == (3, 1)
    [name] = plan_shards([str(w / "samples.parquet")], [part], "ds", 10, w / "plan")
    write_shard(
        str(w / "plan" / f"{name}.samples.parquet"),
        {part: str(w / f"{part}.tar")},
        str(w / f"{name}.tar"),
        str(w / "info.json"),
    )
    assert sorted(tar_members(w / f"{name}.tar")) == sorted(tar_members(w / f"{part}.tar"))
    names = [n for n, _ in tar_members(w / f"{name}.tar")]
    assert names == [f"photos-p{i}.{e}" for i in range(3) for e in ("jpg", "txt", "json")]
    stats = build_index(
        "ds", [str(w / "info.json")], [str(w / "plan" / f"{name}.samples.parquet")], [str(w / "status.parquet")],
        [str(w / "rejected.parquet"), str(w / "plan" / "dropped.parquet")], tmp_path / "out",
    )  # fmt: skip
    assert (stats["input_records"], stats["published"], stats["rejected"]) == (4, 3, 1)
    with tarfile.open(w / f"{name}.tar") as tar:
        assert tar.extractfile("photos-p0.txt").read() == b"photo 0"
        meta = json.load(io.BytesIO(tar.extractfile("photos-p0.json").read()))
    assert meta["fields"] == {"txt": "  photo 0  "} and meta["source_id"] == "p0.jpg"


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
    names = plan_shards([str(part)], ["s-000000"], "ds", 2, tmp_path / "plan", exclusions=[str(excl)])
    kept = [list(pd.read_parquet(tmp_path / "plan" / f"{n}.samples.parquet")["key"]) for n in names]
    assert kept == [["k0", "k2"], ["k3", "k5"], ["k6"]]
    dropped = pd.read_parquet(tmp_path / "plan" / "dropped.parquet")
    assert list(dropped["key"]) == ["k1", "k4"] and set(dropped["reason"]) == {"low_similarity"}
    assert set(dropped["stage"]) == {"embed"} and list(dropped["source_id"]) == ["id1", "id4"]


# ---------------------------------------------------------------- streamed planning: same plan, bounded memory


def reference_plan(
    parts: dict[str, list[str]], excl: dict[str, str], per_shard: int
) -> tuple[list[list[str]], list[tuple[str, str, str]]]:
    """What plan_shards must produce, computed the plain way: every row in memory.
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
@pytest.mark.parametrize("bin_rows", [1_000_000, 9])
def test_streamed_plan_matches_the_in_memory_plan(tmp_path, seed, bin_rows, monkeypatch):
    """Random parts with keys repeated across parts (process_part already rejects repeats within one) and
    exclusions, some of them of first occurrences; with every key in memory, and with keys and decisions
    sorted into bins of 9 rows on disk. Also with every key hashing alike (all in one bin)."""
    import shardsmith.tables as tables_mod

    monkeypatch.setattr(tables_mod, "BIN_ROWS", bin_rows)
    import numpy as np

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
        names = plan_shards(
            [str(tmp_path / f"{p}.samples.parquet") for p in parts], list(parts), "ds", 7, out, exclusions=[str(ex)]
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
    from pathlib import Path

    import shardsmith.tables as tables_mod

    monkeypatch.setattr(tables_mod, "BIN_ROWS", 4000)

    def peak(n_parts: int) -> int:
        folder = Path(tempfile.mkdtemp(dir=tmp_path))
        paths = [
            make_part(folder, f"src-{p:06d}", [f"p{p}-k{i}" for i in range(2000)])["samples"] for p in range(n_parts)
        ]
        tracemalloc.start()
        plan_shards(paths, [f"src-{p:06d}" for p in range(n_parts)], "ds", 1000, folder / "plan")
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
    import pyarrow.parquet as pq

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
    names = plan_shards([part["samples"]], ["src-000000"], "ds", 10, tmp_path / "plan", exclusions=[str(excl)])
    assert list(pd.read_parquet(tmp_path / "plan" / f"{names[0]}.samples.parquet")["key"]) == ["k0", "k2"]
    [row] = pd.read_parquet(tmp_path / "plan" / "dropped.parquet").to_dict("records")
    assert (row["key"], row["reason"]) == ("k1", "low_similarity") and pd.isna(row["detail"])


def test_bins_a_killed_plan_left_behind_are_removed_by_the_next(tmp_path):
    part = make_part(tmp_path, "src-000000", ["k0", "k1"])
    stale = tmp_path / ".spill-killed" / "keys"
    stale.mkdir(parents=True)
    (stale / "00000.arrow").write_bytes(b"half a file")
    plan_shards([part["samples"]], ["src-000000"], "ds", 10, tmp_path / "plan")
    assert not list(tmp_path.glob(".spill-*"))
