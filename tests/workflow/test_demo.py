"""The whole workflow, run with snakemake on the generated demo data, checked as a user would."""

import io
import json
import os
import re
import shutil
import signal
import subprocess
import tarfile
import time

import pandas as pd
import pytest
import yaml
from loader_helpers import (
    installed,
    needs_dali,
    needs_energon,
    needs_hf_datasets,
    read_with_dali,
    read_with_energon,
)
from workflow_helpers import REPO, SNAKEMAKE, demo_config, run_workflow, sha256

from shardsmith.cli.demo import make_demo
from shardsmith.core.leftovers import find_leftovers
from shardsmith.formats import dali, energon
from shardsmith.formats.batches import batch_count, shards_per_job

pytestmark = pytest.mark.workflow
PUBLISHED_FILES = {
    "sizes.json",
    "wids-index.json",
    "manifest.parquet/demo-000000.parquet",  # the manifest and the ledger are folders of parquet pieces
    "rejected.parquet/000000.parquet",
    "stats.json",
    "validation.json",
    *energon.META_FILES,
}


@pytest.fixture(scope="module")
def demo_data(tmp_path_factory):
    data = tmp_path_factory.mktemp("inputs") / "data"
    counts = make_demo(data)
    return data, sum(counts.values())


@pytest.fixture(scope="module")
def build(demo_data, tmp_path_factory):
    data, _ = demo_data
    root = tmp_path_factory.mktemp("build1")
    config = demo_config(data, root)
    run_workflow(root, config)
    return root, config


def out_dir(root):
    return root / "output" / "demo"


def from_downloads(build_root, root):
    """The build's parts as downloaded, copied to `root` with their times (copy2) and without Snakemake's
    records of the build's paths: up to date there (no dedupe, validate or loaders setting changes them), so a
    run in `root` starts with planning. For tests of what comes after the downloads."""
    for part in ("raw", "work/demo/plan/parts", "work/demo/processed"):
        shutil.copytree(build_root / part, root / part, symlinks=True)


def test_ledger_adds_up_every_record_published_or_rejected(build, demo_data):
    root, _ = build
    _, n_inputs = demo_data
    stats = json.loads((out_dir(root) / "stats.json").read_text())
    manifest = pd.read_parquet(out_dir(root) / "manifest.parquet")
    rejected = pd.read_parquet(out_dir(root) / "rejected.parquet")
    assert stats["input_records"] == n_inputs
    assert stats["published"] + stats["rejected"] == n_inputs
    assert len(manifest) == stats["published"] and len(rejected) == stats["rejected"]
    ids = list(manifest["source_id"]) + list(rejected["source_id"])
    assert len(ids) == len(set(ids)) == n_inputs  # each record exactly once
    reasons = set(rejected["reason"])
    assert {"truncated", "not_an_image", "decompression_bomb", "too_small", "no_caption", "not_found"} <= reasons
    assert {"unsafe_member", "no_image"} <= reasons
    assert all(rejected["detail"].str.len() > 0)


def test_openclip_loader_reads_every_published_sample(build):
    import open_clip
    from open_clip_train.data import get_dataset_size, get_wds_dataset

    root, _ = build
    version_dir = root / "fast-storage" / "demo" / (root / "fast-storage" / "demo" / "latest").read_text().strip()
    sizes = json.loads((version_dir / "sizes.json").read_text())
    pattern = str(version_dir / f"demo-{{000000..{len(sizes) - 1:06d}}}.tar")
    total, n_shards = get_dataset_size(pattern)
    assert total == sum(sizes.values()) > 0 and n_shards == len(sizes)

    class Args:
        val_data = pattern
        val_num_samples = None
        batch_size = 4
        workers = 0

    transform = open_clip.image_transform(64, is_train=False)
    info = get_wds_dataset(Args, transform, is_train=False, tokenizer=open_clip.get_tokenizer("ViT-B-32"))
    seen = sum(len(images) for images, texts in info.dataloader)
    assert seen == total


def test_shards_are_uniform_and_keys_dot_free_and_unique(build):
    root, config = build
    sizes = json.loads((out_dir(root) / "sizes.json").read_text())
    counts = [sizes[k] for k in sorted(sizes)]
    assert all(c == config["samples_per_shard"] for c in counts[:-1]) and 0 < counts[-1] <= config["samples_per_shard"]
    keys = []
    for name in sorted(sizes):
        with tarfile.open(out_dir(root) / name) as tar:
            members = tar.getmembers()
            assert all(m.isreg() and m.mtime == 0 and m.uid == 0 and m.uname == "" for m in members)
            names = [m.name for m in members]
        sample_keys = list(dict.fromkeys(n.split(".")[0] for n in names))
        assert names == [f"{k}.{e}" for k in sample_keys for e in ("jpg", "txt", "json")]
        keys += sample_keys
    assert len(keys) == len(set(keys)) == sum(counts)
    assert all("." not in k and len(k) <= 100 for k in keys)


def test_captions_from_json_description_and_sizes_within_limits(build):
    root, config = build
    manifest = pd.read_parquet(out_dir(root) / "manifest.parquet")
    assert max(manifest[["width", "height"]].max()) <= config["resize"]["max_side"]
    assert (manifest["width_before"] >= 4000).any()  # the oversize photos were shrunk, not dropped
    legacy = manifest[manifest["source"] == "legacy"]
    name = legacy["shard"].iloc[0]
    with tarfile.open(out_dir(root) / name) as tar:
        key = legacy[legacy["shard"] == name]["key"].iloc[0]
        txt = tar.extractfile(f"{key}.txt").read().decode()
        meta = json.loads(tar.extractfile(f"{key}.json").read())
    assert txt.startswith("Archive photo") and meta["caption_field"] == "json.description"
    assert meta["fields"]["json"]["description"] == txt


def test_published_version_is_complete_and_latest_written(build):
    root, _ = build
    base = root / "fast-storage" / "demo"
    assert (base / "latest").read_text().strip() == "v1"
    marker = json.loads((base / "v1" / "_COMPLETE.json").read_text())
    for name, entry in marker["files"].items():
        assert sha256(base / "v1" / name) == entry["sha256"]
        assert sha256(out_dir(root) / name) == entry["sha256"]
    assert set(marker["files"]) >= PUBLISHED_FILES
    shards = [n for n in marker["files"] if n.endswith(".tar")]
    assert {dali.index_name(n) for n in shards} | {energon.tar_index_name(n) for n in shards} <= set(marker["files"])


def published_version(root):
    base = root / "fast-storage" / "demo"
    return base / (base / "latest").read_text().strip()


def test_published_loader_indexes_follow_dali_and_energon_formats(build):
    """Runs everywhere, DALI and Energon installed or not: the published files, read as those loaders read them."""
    from shardsmith.shards.validate import loader_members

    version = published_version(build[0])
    sizes = json.loads((version / "sizes.json").read_text())
    for name in sizes:
        with tarfile.open(version / name) as tar:
            members = loader_members(tar.getmembers())
        assert dali.check_index(version / dali.index_name(name), members) == []
        assert energon.check_tar_index(version / energon.tar_index_name(name), members) == []
    assert energon.check_meta(version, sizes) == []
    assert json.loads((version / "validation.json").read_text())["loader_indexes"]["dali"] == "v1.2 per shard"


def expected_samples(version) -> dict[str, tuple[bytes, bytes, bytes]]:
    """{key: (jpg, txt, json)} of every published sample, read with tarfile."""
    out = {}
    for name in json.loads((version / "sizes.json").read_text()):
        with tarfile.open(version / name) as tar:
            members = tar.getmembers()
            for i in range(0, len(members), 3):
                out[members[i].name.split(".")[0]] = tuple(tar.extractfile(m).read() for m in members[i : i + 3])
    return out


@needs_dali
def test_dali_reads_every_published_sample_with_its_bytes_through_the_index_files(build, monkeypatch):
    version = published_version(build[0])
    sizes = json.loads((version / "sizes.json").read_text())
    shards = sorted(sizes)
    got = read_with_dali([str(version / n) for n in shards], [str(version / dali.index_name(n)) for n in shards])
    want = expected_samples(version)
    assert len(got) == sum(sizes.values()) == len(want) and got == list(want.values())
    # the card's own DALI code, on the CPU (it decodes on the GPU as written), from the version's folder
    code = re.findall(r"```python\n(.*?)\n```", (version / "README.md").read_text(), re.S)[0]
    code = code.replace("device_id=0", "device_id=None").replace('device="mixed"', 'device="cpu"')
    monkeypatch.chdir(version)
    namespace: dict = {}
    exec(code, namespace)
    p = namespace["pipe"]()
    p.build()
    assert p.epoch_size("reader") == sum(sizes.values())
    images, captions = p.run()
    assert len(images) == 256 or len(images) == sum(sizes.values()) or len(images) > 0


@needs_hf_datasets
def test_hugging_face_datasets_reads_every_published_sample_with_its_image_caption_and_json(
    build, tmp_path, monkeypatch
):
    """Hugging Face `datasets`' own webdataset builder over the version's shards, offline: every sample once,
    its jpg decoded as the image it is, its txt and json as written."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import datasets
    from PIL import Image

    version = published_version(build[0])
    shards = [str(version / n) for n in json.loads((version / "sizes.json").read_text())]
    got = datasets.load_dataset(
        "webdataset", data_files={"train": shards}, split="train", cache_dir=str(tmp_path / "cache")
    )
    want = expected_samples(version)
    assert len(got) == len(want) and set(got.column_names) >= {"__key__", "jpg", "txt", "json"}
    for row in got:
        jpg, txt, meta = want[row["__key__"]]
        with Image.open(io.BytesIO(jpg)) as image:
            assert row["jpg"].size == image.size and row["jpg"].mode == "RGB"
        # Arrow gives the json column one struct type, inferred from the first samples: keys a sample lacks come
        # back as None, and `fields` (each source's own columns) keeps only the first samples' (docs/output.md)
        meta = json.loads(meta)
        assert row["txt"] == txt.decode() and set(row["json"]) == set(meta)
        got_meta = {k: v for k, v in row["json"].items() if k != "fields"}
        assert got_meta == {k: v for k, v in meta.items() if k != "fields"}
    assert sorted(got["__key__"]) == sorted(want)


@needs_energon
def test_energon_reads_every_published_sample_with_image_and_caption_and_lint_passes(build):
    version = published_version(build[0])
    want = {k: v[1].decode() for k, v in expected_samples(version).items()}
    manifest = pd.read_parquet(version / "manifest.parquet").set_index("key")
    got = read_with_energon(str(version), "train")
    assert {k: c for k, (_, c) in got.items()} == want
    assert all(shape == (3, manifest.at[k, "height"], manifest.at[k, "width"]) for k, (shape, _) in got.items())
    energon_cli = str(SNAKEMAKE.parent / "energon")
    lint = subprocess.run(
        [energon_cli, "lint", str(version), "--split-parts", "train"], capture_output=True, text=True, timeout=300
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_without_energon_sqlite_the_version_has_every_file_but_the_index_and_trains_the_same(
    build, demo_data, tmp_path
):
    data, _ = demo_data
    root = tmp_path / "no-sqlite"
    from_downloads(build[0], root)
    run_workflow(root, demo_config(data, root, loaders={"energon_sqlite": False}))
    version, with_index = published_version(root), published_version(build[0])
    files = {str(p.relative_to(version)) for p in version.rglob("*") if p.is_file()}
    assert files == {str(p.relative_to(with_index)) for p in with_index.rglob("*") if p.is_file()} - {
        ".nv-meta/index.sqlite"
    }
    assert not (out_dir(root) / ".nv-meta" / "index.sqlite").exists()
    assert not (root / "logs" / "write_energon_sqlite.log").exists()  # the job is not in the DAG
    assert json.loads((version / "validation.json").read_text())["ok"]
    for name in (n for n in files if n.endswith(".tar") or n.startswith(".nv-meta/")):
        assert sha256(version / name) == sha256(with_index / name), name
    if not installed("megatron.energon"):
        return
    got = read_with_energon(str(version), "train")
    assert set(got) == set(expected_samples(version))
    lint = subprocess.run(
        [str(SNAKEMAKE.parent / "energon"), "lint", str(version), "--split-parts", "train"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_rebuild_in_a_fresh_folder_is_byte_identical_and_so_is_its_version_published_by_several_jobs(
    build, demo_data, tmp_path
):
    root1, _ = build
    data, _ = demo_data
    root2 = tmp_path / "build2"
    # the first build writes its shards in as few jobs as give each 4,000 samples and uploads in one (the
    # defaults at this size); this one writes batches of 3 shards (the last one shorter) and uploads a shard a job
    publish = {"dest": str(root2 / "fast-storage"), "shards_per_job": 1}
    run_workflow(root2, demo_config(data, root2, shards_per_job=3, publish=publish))
    files1 = sorted(str(p.relative_to(out_dir(root1))) for p in out_dir(root1).rglob("*") if p.is_file())
    assert files1 == sorted(str(p.relative_to(out_dir(root2))) for p in out_dir(root2).rglob("*") if p.is_file())
    assert any(f.endswith(".tar") for f in files1) and set(energon.META_FILES) <= set(files1)
    for name in files1:
        assert sha256(out_dir(root1) / name) == sha256(out_dir(root2) / name), name
    shards = sum(f.endswith(".tar") for f in files1)
    assert len(list((root1 / "logs" / "demo" / "upload_shards").glob("*.log"))) == 1
    assert len(list((root2 / "logs" / "demo" / "upload_shards").glob("*.log"))) == shards > 1
    per_job = shards_per_job("auto", shards, demo_config(data, root1)["samples_per_shard"])
    assert len(list((root1 / "logs" / "demo" / "write_shard").glob("*.log"))) == batch_count(shards, per_job)
    assert len(list((root2 / "logs" / "demo" / "write_shard").glob("*.log"))) == -(-shards // 3) > 1
    one, several = published_version(root1), published_version(root2)
    names = sorted(str(p.relative_to(one)) for p in one.rglob("*") if p.is_file())
    assert names == sorted(str(p.relative_to(several)) for p in several.rglob("*") if p.is_file())
    for name in names:
        if name != "_COMPLETE.json":
            assert sha256(one / name) == sha256(several / name), name
    marker1, marker2 = (json.loads((v / "_COMPLETE.json").read_text()) for v in (one, several))
    assert marker1.pop("published_at") and marker2.pop("published_at") and marker1 == marker2


def batch_record(root, batch="00000"):
    return json.loads((root / "work" / "demo" / "shards" / "batches" / f"{batch}.json").read_text())


def test_a_batch_of_shards_run_again_keeps_every_shard_written_from_the_same_inputs(build, tmp_path):
    """write_shard takes a batch of shards; a rerun (the batch made again, a job killed after some shards, a
    changed part) writes only the shards whose inputs changed or that were never committed."""
    root1, config1 = build
    root = tmp_path / "copy"
    shutil.copytree(root1, root, symlinks=True)  # mtimes kept: the copy is as up to date as the build
    config = json.loads(json.dumps(config1).replace(str(root1), str(root)))
    tars = sorted((root / "output" / "demo").glob("demo-*.tar"))
    shards = [t.name.removesuffix(".tar").split("-")[1] for t in tars]
    before = {t.name: (sha256(t), t.stat().st_mtime_ns) for t in tars}

    # one batch of every shard instead of a shard a job: the batch runs, and keeps them all
    config["shards_per_job"] = len(shards)
    run_workflow(root, config, "--forcerun", "write_shard", "--until", "list_shards")
    assert batch_record(root) == {"written": [], "kept": shards}
    assert {t.name: (sha256(t), t.stat().st_mtime_ns) for t in tars} == before

    # as a job killed while writing the third shard leaves it: two shards committed, the third not
    (root / "work" / "demo" / "shards" / f"demo-{shards[2]}.written").unlink()
    tars[2].unlink()
    run_workflow(root, config, "--forcerun", "write_shard", "--until", "list_shards")
    assert batch_record(root) == {"written": [shards[2]], "kept": shards[:2] + shards[3:]}
    assert {t.name: sha256(t) for t in tars} == {name: digest for name, (digest, _) in before.items()}

    # a part rewritten (a refresh's grown part): the shards that draw from it are written again, no other
    parts_of = {s: (root / "work" / "demo" / "plan" / "shards" / f"demo-{s}.parts").read_text().split() for s in shards}
    part = parts_of[shards[-1]][-1]
    processed = next((root / "work" / "demo").rglob(f"{part}.tar"))
    os.utime(processed, ns=(time.time_ns(), time.time_ns()))
    run_workflow(root, config, "--forcerun", "write_shard", "--until", "list_shards")
    changed = [s for s in shards if part in parts_of[s]]
    assert batch_record(root) == {"written": changed, "kept": [s for s in shards if s not in changed]}
    assert 0 < len(changed) < len(shards)


def test_overlapping_paths_are_refused_before_any_work(demo_data, tmp_path):
    data, _ = demo_data
    config = demo_config(data, tmp_path)
    config["paths"]["raw"] = str(data / "photos")  # the image folder used as the cache folder
    proc = run_workflow(tmp_path, config, check=False)
    assert proc.returncode != 0
    assert "paths.raw" in proc.stderr and "overlaps input folder" in proc.stderr
    assert not (tmp_path / "work").exists() and not (data / "photos" / "demo").exists()


def test_bad_config_value_names_the_key(demo_data, tmp_path):
    data, _ = demo_data
    config = demo_config(data, tmp_path, samples_per_shard="lots")
    proc = run_workflow(tmp_path, config, check=False)
    assert proc.returncode != 0 and "samples_per_shard" in proc.stderr


def test_validation_failure_stops_the_run_and_nothing_is_published(build, demo_data, tmp_path):
    data, _ = demo_data
    from_downloads(build[0], tmp_path)
    config = demo_config(data, tmp_path, validate={"min_shards": 64})
    proc = run_workflow(tmp_path, config, check=False)
    assert proc.returncode != 0
    assert "fewer than validate.min_shards=64" in proc.stdout + proc.stderr
    assert not (tmp_path / "fast-storage" / "demo").exists()


def _tars_are_whole(folder):
    for path in folder.rglob("*.tar"):
        with tarfile.open(path) as tar:  # a truncated tar raises here or while listing
            tar.getmembers()


def test_killed_run_leaves_no_truncated_tar_and_rerun_completes(build, demo_data, tmp_path):
    root1, _ = build
    data, _ = demo_data
    root = tmp_path / "killed"
    config = demo_config(data, root)
    root.mkdir()
    # written as run_workflow writes it (keys in the config's order) for the rerun below: params equal to the
    # killed run's, so that it reruns only what the kill left unfinished, not every job
    (root / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    cmd = [str(SNAKEMAKE), "-s", str(REPO / "Snakefile"), "--directory", str(root), "--configfile",
           str(root / "config.yaml"), "--workflow-profile", "none", "--cores", "1"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 300
    while time.time() < deadline and len(list((root / "work").rglob("processed/*.tar"))) < 2:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # like an OOM kill or a node failure: no clean-up at all
    proc.wait()
    assert not (root / "fast-storage" / "demo" / "latest").exists()
    for kind in ("raw", "work", "output"):
        if (root / kind).exists():
            _tars_are_whole(root / kind)
    run_workflow(root, config, "--unlock")
    run_workflow(root, config, "--rerun-incomplete")
    for name in json.loads((out_dir(root1) / "sizes.json").read_text()):
        assert sha256(out_dir(root) / name) == sha256(out_dir(root1) / name)
    assert find_leftovers([root]) == []  # the killed jobs' temporary files went with the rerun


def _tables_are_whole(folder):
    import pyarrow as pa
    import pyarrow.parquet as pq

    for path in folder.rglob("*.parquet"):
        pq.read_table(path)  # a torn file raises
    for path in folder.rglob("*.arrow"):
        with pa.memory_map(str(path)) as src:
            pa.ipc.open_file(src).read_all()


@pytest.mark.parametrize(
    ("during", "buckets"),
    [("find_near_pairs", 3), ("decide_near_round", 3), ("plan_shards", 3), ("find_near_pairs", 1)],
)
def test_planning_in_buckets_killed_mid_job_gives_the_one_bucket_build_on_rerun(
    build, demo_data, tmp_path, during, buckets
):
    """Planning in 3 buckets and 2 decision rounds (slices of 2 partitions), killed (SIGKILL, the whole run) as
    soon as a bucket's search, a slice's decision or the plan starts, or in one bucket (planning in one job,
    plan_shards') as its search starts: no torn table, and the rerun publishes what the one-bucket build
    published, byte for byte, ledger included. The run starts from the build's parts as downloaded (what
    planning reads; no dedupe setting changes them), so each kill lands after a few jobs, not the downloads."""
    root1, _ = build
    data, _ = demo_data
    root = tmp_path / "killed"
    config = demo_config(data, root)
    config["dedupe"] = {"near": "report", "buckets": 3, "decision_rounds": 2, "buckets_per_job": 2}
    if buckets == 1:
        config["dedupe"] = {"near": "report"}
    from_downloads(root1, root)
    # written as run_workflow writes it (keys in the config's order) for the rerun below: params equal to the
    # killed run's, so that it reruns only what the kill left unfinished, not every job
    (root / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    cmd = [str(SNAKEMAKE), "-s", str(REPO / "Snakefile"), "--directory", str(root), "--configfile",
           str(root / "config.yaml"), "--workflow-profile", "none", "--cores", "1"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    logs = root / "logs" / "demo"
    deadline = time.time() + 300
    while time.time() < deadline and not (list(logs.glob(f"{during}/**/*.log")) + list(logs.glob(f"{during}.log"))):
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert time.time() < deadline, f"{during} never started"
    if buckets == 1:  # the step ran within plan_shards' job
        assert (logs / "plan_shards.log").exists()
    _tables_are_whole(root / "work")
    run_workflow(root, config, "--unlock")
    run_workflow(root, config, "--rerun-incomplete")
    pieces = [
        p.relative_to(out_dir(root1)) for t in ("rejected", "manifest") for p in out_dir(root1).glob(f"{t}.parquet/*")
    ]
    assert pieces and sorted(p.relative_to(out_dir(root)) for t in ("rejected", "manifest")
                             for p in out_dir(root).glob(f"{t}.parquet/*")) == sorted(pieces)  # fmt: skip
    for name in [*json.loads((out_dir(root1) / "sizes.json").read_text()), *pieces]:
        assert sha256(out_dir(root) / name) == sha256(out_dir(root1) / name), name
    assert find_leftovers([root]) == []
