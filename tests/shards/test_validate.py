"""Shard validation with OpenCLIP's own loader code: what passes, what is caught, and the dataset-wide checks."""

import hashlib
import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from workflow_helpers import REPO

from shardsmith.cli.demo import jpeg, photo
from shardsmith.formats.tables import key_digest_sum
from shardsmith.formats.tario import ShardWriter
from shardsmith.shards.validate import ValidationFailed, check_dataset, spread, validate_shard, write_json

RNG = np.random.default_rng(3)
IMAGE = jpeg(photo(RNG, 96, 64))


def make_shard(
    folder: Path, name: str, samples: list[tuple[str, dict[str, bytes]]], planned: dict[str, bytes] | None = None
) -> tuple[str, str, str]:
    """(tar, plan, info) as write_shard and plan_shards leave them; `planned`: the image download_part made
    for a key, when the shard holds other bytes."""
    tar = folder / f"{name}.tar"
    if all("." not in key for key, _ in samples):
        with open(tar, "wb") as f, ShardWriter(f) as w:
            for key, members in samples:
                w.write(key, members)
    else:  # ShardWriter refuses such keys: written as another tool would
        with tarfile.open(tar, "w") as t:
            for key, members in samples:
                for ext, data in members.items():
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    t.addfile(info, io.BytesIO(data))
    plan = folder / f"{name}.samples.parquet"
    planned = planned or {}
    rows = [
        {"key": k, "sha256": hashlib.sha256(planned.get(k, m.get("jpg", b""))).hexdigest(), "width": 96, "height": 64}
        for k, m in samples
    ]
    pd.DataFrame(rows, columns=["key", "sha256", "width", "height"]).to_parquet(plan, index=False)
    data = tar.read_bytes()
    info = folder / f"{name}.json"
    info.write_text(json.dumps({"shard": tar.name, "sha256": hashlib.sha256(data).hexdigest(), "filesize": len(data)}))
    return str(tar), str(plan), str(info)


def good(n: int, prefix: str = "s") -> list[tuple[str, dict[str, bytes]]]:
    return [(f"{prefix}{i:04d}", {"jpg": IMAGE, "txt": f"caption {i}".encode(), "json": b"{}"}) for i in range(n)]


def test_a_good_shard_passes_with_openclips_loader(tmp_path):
    tar, plan, _ = make_shard(tmp_path, "ds-000000", good(5))
    report = validate_shard(tar, plan, max_side=512, max_pixels=25_000_000)
    assert report == {
        "shard": "ds-000000.tar",
        "loader": "open_clip_train.data",
        "groups": 5,
        "passed": 5,
        "decoded": 5,
        "problems": [],
        "key_sum": key_digest_sum([f"s{i:04d}" for i in range(5)]),  # the keys as read, for the dataset check
    }


def test_every_image_is_checked_against_the_processed_bytes_and_a_spread_is_decoded(tmp_path):
    samples = good(10)
    other = jpeg(photo(RNG, 96, 64))  # decodes fine, but is not the image download_part made for s0003
    samples[3] = ("s0003", {**samples[3][1], "jpg": other})
    tar, plan, _ = make_shard(tmp_path, "ds-000000", samples, planned={"s0003": IMAGE})
    report = validate_shard(tar, plan, max_side=512, max_pixels=25_000_000, decode_per_shard=4)
    assert report["decoded"] == 4 and report["passed"] == 10
    assert report["problems"] == ["ds-000000.tar/s0003: image bytes differ from the processed image"]


def made_from_a_part(
    folder: Path, samples: list, in_shard: list, planned: dict | None = None
) -> tuple[str, str, dict[str, str]]:
    """(tar, plan, parts) as write_shard validates them: the plan says where each image lies in its processed
    part, which holds `samples`; the shard holds `in_shard`."""
    part = folder / "web-000000.tar"
    with open(part, "wb") as f, ShardWriter(f, unique_keys=False) as w:
        where = {key: w.write(key, members)["jpg"] for key, members in samples}
    tar, plan, _ = make_shard(folder, "ds-000000", in_shard, planned)
    rows = pd.read_parquet(plan).assign(part="web-000000")
    rows["jpg_offset"], rows["jpg_size"] = [where[k][0] for k in rows["key"]], [where[k][1] for k in rows["key"]]
    rows.to_parquet(plan, index=False)
    return tar, plan, {"web-000000": str(part)}


def test_images_are_compared_with_their_processed_part_and_not_hashed_again(tmp_path, monkeypatch):
    samples = good(6)
    flipped = bytearray(IMAGE)
    flipped[len(IMAGE) // 2] ^= 1  # same size, one bit off
    in_shard = [*samples[:2], ("s0002", {**samples[2][1], "jpg": bytes(flipped)}), *samples[3:]]
    tar, plan, parts = made_from_a_part(tmp_path, samples, in_shard)
    good_dir = tmp_path / "good"
    good_dir.mkdir()
    good_tar, good_plan, good_parts = made_from_a_part(good_dir, samples, samples)
    sha256 = hashlib.sha256

    def no_image_hashed(data=b"", *args, **kwargs):
        assert len(data) != len(IMAGE), "an image hashed a second time"
        return sha256(data, *args, **kwargs)

    monkeypatch.setattr(hashlib, "sha256", no_image_hashed)
    report = validate_shard(tar, plan, max_side=512, max_pixels=25_000_000, decode_per_shard=0, parts=parts)
    assert report["passed"] == 6
    assert report["problems"] == ["ds-000000.tar/s0002: image bytes differ from the processed image"]
    assert validate_shard(good_tar, good_plan, 512, 25_000_000, 0, parts=good_parts)["problems"] == []


def test_a_plan_naming_a_part_not_given_is_checked_by_sha256(tmp_path):
    samples = good(3)
    in_shard = [samples[0], ("s0001", {**samples[1][1], "jpg": jpeg(photo(RNG, 96, 64))}), samples[2]]
    tar, plan, _ = made_from_a_part(tmp_path, samples, in_shard, planned={"s0001": IMAGE})
    report = validate_shard(tar, plan, 512, 25_000_000, 0, parts={"web-000009": "elsewhere.tar"})
    assert report["problems"] == ["ds-000000.tar/s0001: image bytes differ from the processed image"]


def test_an_image_that_does_not_decode_is_caught_by_the_spot_check(tmp_path):
    broken = IMAGE[: len(IMAGE) // 2]
    samples = good(3)
    samples[0] = ("s0000", {**samples[0][1], "jpg": broken})
    tar, plan, _ = make_shard(tmp_path, "ds-000000", samples)
    report = validate_shard(tar, plan, max_side=512, max_pixels=25_000_000, decode_per_shard=2)  # decodes 0 and 2
    assert report["passed"] == 2
    assert any(p.startswith("ds-000000.tar/s0000: does not decode: ") for p in report["problems"])
    assert any("1 of 3 samples dropped by OpenCLIP's filter/decoder" in p for p in report["problems"])


@pytest.mark.parametrize(
    ("n", "k", "want"),
    [(10, None, None), (10, 10, None), (10, 4, {0, 3, 6, 9}), (10, 1, {0}), (10, 0, set()), (0, 3, None), (1, 2, None)],
)
def test_spread_picks_evenly_with_both_ends(n, k, want):
    assert spread(n, k) == want


def test_samples_openclip_would_drop_are_problems(tmp_path):
    samples = good(3)
    samples[1] = ("s0001", {"jpg": IMAGE, "json": b'{"description": "caption only in json"}'})  # no txt member
    tar, plan, _ = make_shard(tmp_path, "ds-000000", samples)
    report = validate_shard(tar, plan, max_side=512, max_pixels=25_000_000)
    assert report["passed"] == 2
    assert any("1 of 3 samples dropped by OpenCLIP's filter" in p for p in report["problems"])


def test_a_dotted_key_that_splits_a_sample_is_caught(tmp_path):
    # "a.b.jpg" and "a.b.txt" are read as key "a" with members "b.jpg", "b.txt": the sample is lost
    tar, plan, _ = make_shard(tmp_path, "ds-000000", [("a.b", {"jpg": IMAGE, "txt": b"cap"}), *good(2)])
    report = validate_shard(tar, plan, max_side=512, max_pixels=25_000_000)
    assert any("member name 'a.b.jpg'" in p for p in report["problems"])
    assert any("dropped by OpenCLIP's filter" in p for p in report["problems"])


def test_an_oversize_image_is_a_problem(tmp_path):
    tar, plan, _ = make_shard(tmp_path, "ds-000000", good(2))  # planned (and decoded) 96x64
    report = validate_shard(tar, plan, max_side=64, max_pixels=25_000_000)
    assert [p for p in report["problems"] if "over the limits" in p] == [
        "ds-000000.tar/s0000: image 96x64 over the limits",
        "ds-000000.tar/s0001: image 96x64 over the limits",
    ]


def test_a_tar_cut_short_is_a_problem_not_a_crash(tmp_path):
    tar, plan, _ = make_shard(tmp_path, "ds-000000", good(4))
    data = Path(tar).read_bytes()
    Path(tar).write_bytes(data[: len(data) // 2])
    report = validate_shard(tar, plan, 512, 25_000_000)
    assert report["problems"] == [
        "ds-000000.tar: not a readable tar (unexpected end of data); run write_shard for it again"
    ]


def dataset_files(tmp_path, shard_sizes: dict[str, int], shard_reports: list[dict]) -> tuple[list[str], str, str]:
    """One report file per shard, as write_shard leaves them, and the index files validate_dataset reads."""
    reports = []
    for r in shard_reports:
        path = tmp_path / f"{r['shard']}.json"
        write_json(str(path), r)
        reports.append(str(path))
    sizes = tmp_path / "sizes.json"
    sizes.write_text(json.dumps(shard_sizes))
    manifest = tmp_path / "manifest.parquet"
    pd.DataFrame({"key": [f"k{i}" for i in range(sum(shard_sizes.values()))]}).to_parquet(manifest)
    return reports, str(sizes), str(manifest)


def report(shard: str, passed: int) -> dict:
    return {"shard": shard, "loader": "open_clip_train.data", "groups": passed, "passed": passed, "problems": []}


def test_the_dataset_check_combines_the_shard_reports(tmp_path):
    files = dataset_files(
        tmp_path, {"a.tar": 3, "b.tar": 2, "c.tar": 1}, [report("a.tar", 3), report("b.tar", 2), report("c.tar", 1)]
    )
    summary = check_dataset(*files, min_shards=3)
    assert (summary["ok"], summary["shards"], summary["samples"]) == (True, 3, 6)


def test_sizes_json_must_match_what_the_loader_read(tmp_path):
    files = dataset_files(tmp_path, {"a.tar": 3, "b.tar": 2}, [report("a.tar", 3), report("b.tar", 1)])
    with pytest.raises(ValidationFailed, match="b.tar: sizes.json says 2, the loader read 1"):
        check_dataset(*files, min_shards=1)


def test_too_few_shards_for_openclip_fails_and_says_what_helps(tmp_path):
    files = dataset_files(tmp_path, {"a.tar": 3}, [report("a.tar", 3)])
    with pytest.raises(ValidationFailed, match=r"fewer than validate.min_shards=2.*samples_per_shard \(to at most 1\)"):
        check_dataset(*files, min_shards=2)
    with pytest.raises(ValidationFailed, match="3 samples cannot fill 4 shards: lower validate.min_shards"):
        check_dataset(*files, min_shards=4)


def test_a_dataset_of_no_sample_says_so_first_and_not_to_lower_samples_per_shard(tmp_path):
    files = dataset_files(tmp_path, {}, [])
    with pytest.raises(ValidationFailed) as e:
        check_dataset(*files, min_shards=2)
    assert "no sample was published: every input record was rejected" in str(e.value)
    assert "samples_per_shard" not in str(e.value)


def keyed(shard: str, keys: list[str]) -> dict:
    return {**report(shard, len(keys)), "key_sum": key_digest_sum(keys)}


def test_the_shards_keys_must_be_the_keys_planning_kept(tmp_path):
    """Checked by bucket: the digests of the keys the loader read in every shard add up to the planned ones."""
    a, b = [f"k{i}" for i in range(3)], ["k3", "k4"]
    planned = (5, key_digest_sum(a + b))
    reports, sizes, _ = dataset_files(tmp_path, {"a.tar": 3, "b.tar": 2}, [keyed("a.tar", a), keyed("b.tar", b)])
    assert check_dataset(reports, sizes, None, 1, planned=planned)["ok"]
    for other in (["k3", "k1"], ["k3", "k5"], ["k3"]):  # a key in two shards, a sample changed, a sample lost
        files = dataset_files(tmp_path, {"a.tar": 3, "b.tar": len(other)}, [keyed("a.tar", a), keyed("b.tar", other)])
        with pytest.raises(ValidationFailed, match=r"are not the 5 keys planning kept \(their digests differ\)"):
            check_dataset(files[0], files[1], None, 1, planned=planned)


def test_a_key_in_two_shards_fails_the_dataset(tmp_path):
    files = dataset_files(tmp_path, {"a.tar": 3, "b.tar": 2}, [report("a.tar", 3), report("b.tar", 2)])
    pd.DataFrame({"key": ["k0", "k1", "k2", "k3", "k1"]}).to_parquet(files[2])
    with pytest.raises(ValidationFailed, match=r"1 keys occur in more than one sample \(e.g. \['k1'\]\)"):
        check_dataset(*files, min_shards=1)


# ---------------------------------------------------------------- OpenCLIP's code, without torch


def test_the_reader_and_filter_are_openclips_own_functions():
    """What validation runs is compiled from open_clip_train/data.py: the same definitions as the imported module's."""
    import open_clip_train.data as real

    from shardsmith.shards.validate import OPENCLIP_FUNCTIONS, _openclip_stages

    to_samples, keep, loader = _openclip_stages()
    assert loader == "open_clip_train.data"
    assert keep.__code__.co_filename == "open_clip_train/data.py"
    for name, fn in (("tarfile_to_samples_nothrow", to_samples), ("filter_no_caption_or_no_image", keep)):
        assert name in OPENCLIP_FUNCTIONS
        theirs = getattr(real, name).__code__
        assert fn.__name__ == name and (fn.__code__.co_code, fn.__code__.co_names) == (theirs.co_code, theirs.co_names)
    sample = {"__key__": "k", "txt": b"a caption", "json": b"{}"}
    assert not keep(sample) and not real.filter_no_caption_or_no_image(sample)  # json-only captions are dropped
    assert keep({**sample, "webp": b"x"}) and real.filter_no_caption_or_no_image({**sample, "webp": b"x"})


def test_validating_a_shard_and_the_dataset_imports_neither_torch_nor_pandas(tmp_path):
    """torch costs 3 s and ~600 MB per job, pandas ~0.3 s; OpenCLIP's reader and filter need neither, and
    validation runs in every write_shard job and in validate_dataset."""
    import subprocess
    import sys

    tar, plan, _ = make_shard(tmp_path, "ds-000000", good(3))
    reports, sizes, manifest = dataset_files(tmp_path, {"ds-000000.tar": 3}, [report("ds-000000.tar", 3)])
    code = (
        "import sys; from shardsmith.shards.validate import validate_shard, check_dataset, planned_keys; "
        f"r = validate_shard({tar!r}, {plan!r}, 512, 25_000_000); "
        f"check_dataset({reports!r}, {sizes!r}, {manifest!r}, 1); "
        f"planned_keys([], {manifest!r}); "
        "print(r['passed'], r['loader'], 'torch' in sys.modules, 'pandas' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.split() == ["3", "open_clip_train.data", "False", "False"]


def test_missing_openclip_definitions_are_a_key_error_not_a_silent_substitute():
    from shardsmith.shards.validate import openclip_source_functions

    source = "import torch\n\ndef filter_no_caption_or_no_image(sample):\n    return True\n"
    with pytest.raises(KeyError, match="log_and_continue"):
        openclip_source_functions(source, {})


def test_when_the_source_no_longer_matches_the_module_is_imported_whole(monkeypatch):
    import open_clip_train.data as real

    from shardsmith.shards import validate

    def broken(source, namespace):
        raise KeyError("group_by_keys_nothrow")

    monkeypatch.setattr(validate, "openclip_source_functions", broken)
    validate._openclip_stages.cache_clear()
    try:
        to_samples, keep, loader = validate._openclip_stages()
        assert keep is real.filter_no_caption_or_no_image and to_samples is real.tarfile_to_samples_nothrow
        assert loader == "open_clip_train.data"
    finally:
        validate._openclip_stages.cache_clear()


def test_the_loaders_indexes_are_checked_against_the_shard_as_read(tmp_path):
    from shardsmith.formats import dali, energon
    from shardsmith.shards.validate import loader_members

    tar, plan, _ = make_shard(tmp_path, "ds-000000", good(3))
    other, _, _ = make_shard(tmp_path, "ds-000001", good(3, prefix="longer-key-"))
    with tarfile.open(tar) as t:
        members = loader_members(t.getmembers())
    with tarfile.open(other) as t:
        stale = loader_members(t.getmembers())  # the indexes of another shard: right format, wrong offsets
    idx, tidx = tmp_path / "ds-000000.idx", tmp_path / "ds-000000.tar.idx"
    dali.write_index(idx, members)
    energon.write_tar_index(tidx, members)
    good_report = validate_shard(tar, plan, 512, 25_000_000, dali_index=str(idx), energon_index=str(tidx))
    assert good_report["problems"] == []
    dali.write_index(idx, stale)
    energon.write_tar_index(tidx, stale[:-3])
    problems = validate_shard(tar, plan, 512, 25_000_000, dali_index=str(idx), energon_index=str(tidx))["problems"]
    assert [p.split(":")[0] for p in problems] == ["ds-000000.idx", "ds-000000.tar.idx"]


def test_the_dataset_check_reads_energons_meta_against_sizes_json(tmp_path):
    from shardsmith.formats import energon
    from shardsmith.formats.tario import TarMember

    files = dataset_files(
        tmp_path, {"ds-000000.tar": 2, "ds-000001.tar": 1}, [report("ds-000000.tar", 2), report("ds-000001.tar", 1)]
    )
    layout = {"ds-000000.tar": ["k0", "k1"], "ds-000001.tar": ["k2"]}
    exts = ("jpg", "txt")
    shards = [
        (n, [TarMember(k, e, 512 + 2048 * i + 1024 * j, 10) for i, k in enumerate(keys) for j, e in enumerate(exts)])
        for n, keys in layout.items()
    ]
    energon.write_meta(tmp_path, [(n, len(layout[n]), "0" * 64) for n, _ in shards])
    with pytest.raises(ValidationFailed, match=r"index.sqlite: missing"):  # asked for, not written
        check_dataset(*files, min_shards=1, energon_dir=str(tmp_path))
    assert check_dataset(*files, min_shards=1, energon_dir=str(tmp_path), energon_sqlite=False)["ok"]
    energon.write_sqlite(tmp_path, shards)
    summary = check_dataset(*files, min_shards=1, energon_dir=str(tmp_path))
    assert summary["ok"] and summary["loader_indexes"]["energon"] == f".nv-meta of energon {energon.FORMAT_VERSION}"
    files = dataset_files(
        tmp_path, {"ds-000000.tar": 2, "ds-000001.tar": 2}, [report("ds-000000.tar", 2), report("ds-000001.tar", 2)]
    )
    with pytest.raises(ValidationFailed, match="shard_counts differ from sizes.json"):
        check_dataset(*files, min_shards=1, energon_dir=str(tmp_path))
