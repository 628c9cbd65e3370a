"""Shard writing (shardsmith.shards.write): the planned members copied in order, byte ranges with the same bytes
as member-by-member writes, where every member landed, byte-identical rewrites, no pandas in the job."""

import hashlib
import io
import json
import tarfile

import pandas as pd
import pyarrow.parquet as pq
import pytest
from generated import jpeg_bytes
from workflow_helpers import REPO

from shardsmith.download.part import download_part
from shardsmith.download.process.captions import CaptionSettings
from shardsmith.download.process.child import PartProcessor
from shardsmith.download.process.resize import ResizeSettings
from shardsmith.download.rawcache import STATUS_COLUMNS
from shardsmith.download.sources import plan_parts
from shardsmith.formats.index import build_index
from shardsmith.formats.tario import ShardWriter, TarMember, read_member
from shardsmith.shards.write import read_members, write_shard
from tests.shards.reference import plan_in_process
from tests.shards.test_plan import EXPECTED_KEYS, index_args, make_built, members_of, tar_members


@pytest.fixture
def built(tmp_path):
    return make_built(tmp_path)


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
            # what stats.json counts of the shard's rows (make_built passes out_manifest)
            "published_by_source": {"src": 4}, "passthrough": info["passthrough"], "blurred": 0,
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
    importing pandas would add ~0.3 s to each job's start-up (validation: tests/shards/test_validate.py). index_shards
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
from shardsmith.shards.write import write_shard
from shardsmith.report.card import card_text
from shardsmith.formats.build import build_info
info = write_shard({plan!r}, {parts!r}, {str(out / f"{n}.tar")!r}, {str(out / "info.json")!r},
                   out_manifest={str(out / "piece.parquet")!r})
stats = {stats!r}
card_text({{"dataset": "ds", "samples_per_shard": 4}}, stats, {{info["shard"]: info["nsamples"]}},
          "open_clip_train.data", versions={{}})
build_info({{"dataset": "ds"}}, "9", ".")
print(info["nsamples"], stats["published"], sorted(m for m in ("pandas", "torch", "matplotlib") if m in sys.modules))
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
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
    [name] = plan_in_process([str(w / "samples.parquet")], [part], "ds", 10, w / "plan")
    write_shard(
        str(w / "plan" / f"{name}.samples.parquet"),
        {part: str(w / f"{part}.tar")},
        str(w / f"{name}.tar"),
        str(w / "info.json"),
        out_manifest=str(w / "manifest.parquet"),
    )
    assert sorted(tar_members(w / f"{name}.tar")) == sorted(tar_members(w / f"{part}.tar"))
    names = [n for n, _ in tar_members(w / f"{name}.tar")]
    assert names == [f"photos-p{i}.{e}" for i in range(3) for e in ("jpg", "txt", "json")]
    stats = build_index(
        "ds", [str(w / "info.json")], [str(w / "manifest.parquet")], [str(w / "status.parquet")],
        [str(w / "rejected.parquet"), str(w / "plan" / "dropped.parquet")], tmp_path / "out",
    )  # fmt: skip
    assert (stats["input_records"], stats["published"], stats["rejected"]) == (4, 3, 1)
    with tarfile.open(w / f"{name}.tar") as tar:
        assert tar.extractfile("photos-p0.txt").read() == b"photo 0"
        meta = json.load(io.BytesIO(tar.extractfile("photos-p0.json").read()))
    assert meta["fields"] == {"txt": "  photo 0  "} and meta["source_id"] == "p0.jpg"
