"""A scheduled refresh end to end: tools/schedule/refresh.sh builds the demo and publishes it to S3
(moto_server through the real aws CLI), the source grows, the next refresh runs only the new parts and
publishes a new version with old plus new records and no duplicates, and a refresh from a fresh checkout
with nothing new runs nothing."""

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import uuid
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from generated import jpeg_bytes
from workflow_helpers import REPO, demo_config

from shardsmith.cli.demo import jpeg, make_demo, photo
from shardsmith.cli.refresh import jobs_run, snakemake_logs
from shardsmith.storage.s3 import run
from shardsmith.storage.stores import MARKER, complete_versions, latest_version

pytestmark = pytest.mark.workflow
SECRET, KEY_ID = "SeCrEt-refresh-never-logged-77c1", "AKIDREFRESHNEVERLOGGED"


def checkout(dest: Path) -> Path:
    """A fresh checkout of the workflow at `dest`: the same files, every one with a new mtime."""
    shutil.rmtree(dest, ignore_errors=True)
    skip = shutil.ignore_patterns(
        ".venv", ".git", "demo", "bench", ".snakemake", ".pytest_cache", "__pycache__", "tests"
    )
    shutil.copytree(REPO, dest, ignore=skip, copy_function=shutil.copy)
    return dest


def validation_reports(root: Path, config: dict) -> dict[str, dict]:
    """Shard name -> its validation report (as write_shard left it) and the report file's mtime."""
    folder = root / config["paths"]["work"] / "demo" / "validate"
    reports = {}
    for f in sorted(folder.glob("demo-*.json")):
        r = json.loads(f.read_text())
        reports[r["shard"]] = {**r, "mtime_ns": f.stat().st_mtime_ns}
    return reports


def shards_written(root: Path, config: dict, batches: set[str]) -> set[str]:
    """The shards that the write_shard jobs of `batches` wrote, not kept (their records)."""
    folder = root / config["paths"]["work"] / "demo" / "shards" / "batches"
    return {s for b in batches for s in json.loads((folder / f"{b}.json").read_text())["written"]}


def refresh(root: Path, repo: Path, *options: str) -> tuple[subprocess.CompletedProcess, list[tuple[str, dict]], str]:
    """Run tools/schedule/refresh.sh of `repo` in `root`, as cron would; returns the jobs it ran and the log."""
    before = set(snakemake_logs(root))
    env = {
        **os.environ,
        "SHARDSMITH_VENV": str(Path(sys.executable).parents[1]),
        "SHARDSMITH_CORES": "2",
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_ACCESS_KEY_ID": KEY_ID,
    }
    proc = subprocess.run(
        [str(repo / "tools" / "schedule" / "refresh.sh"), "config.yaml", "--workflow-profile", "none", *options],
        cwd=root, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    if proc.returncode != 0:
        raise AssertionError(f"refresh failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    text = "".join(log.read_text() for log in snakemake_logs(root) if log not in before)
    return proc, jobs_run(text), text


def ran(jobs, rule) -> set[str]:
    return {",".join(w.values()) for r, w in jobs if r == rule}


def grow_sources(data: Path) -> dict[str, list[str]]:
    """Append to the manifest (new images, a published URL again, a published image under a new name)
    and add a source shard; returns what each kind of new record is."""
    rng = np.random.default_rng(99)
    rows, fresh = [], []
    for i in range(6):
        path = data / "images" / f"fresh_{i}.jpg"
        path.write_bytes(jpeg(photo(rng, 320, 240)))
        rows.append(f"A new picture number {i}\t{path}\n")
        fresh.append(str(path))
    rows.append(f"The naval officer again\t{data / 'images' / 'small_00.jpg'}\n")  # a published URL
    copy = data / "images" / "copy_of_small_01.jpg"
    shutil.copy(data / "images" / "small_01.jpg", copy)  # a published image under a new URL
    rows.append(f"Rocky hills, posted again\t{copy}\n")
    with open(data / "manifest.tsv", "a", encoding="utf-8") as f:
        f.writelines(rows)
    shard = data / "shards" / "legacy-000002.tar"
    with tarfile.open(shard, "w") as tar:
        for i in range(2):
            for name, payload in (
                (f"0002000{i}.jpg", jpeg(photo(rng, 300, 200))),
                (f"0002000{i}.json", json.dumps({"description": f"Archive photo 2-{i}"}).encode()),
            ):
                info = tarfile.TarInfo(name)
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    return {
        "fresh": fresh,
        "same_url": [str(data / "images" / "small_00.jpg")],
        "same_image": [str(copy)],
        "shard": [str(shard)],
    }


@pytest.fixture(scope="module")
def refreshed(s3_server, tmp_path_factory):
    """Three scheduled runs: the first build, a refresh after the source grew, a no-change refresh."""
    root = tmp_path_factory.mktemp("refresh")
    data = root / "data"
    make_demo(data)
    bucket = f"refresh-{uuid.uuid4().hex[:10]}"
    run(s3_server, "s3", "mb", f"s3://{bucket}")
    config = demo_config(data, root, version="auto")
    config["sources"][2]["path"] = str(data / "shards" / "legacy-*.tar")  # a glob, so new shards join
    config["dedupe"]["buckets"] = 3  # the published records looked up by 3 bucket jobs (tests/shards: 1 vs many)
    config["shards_per_job"] = 2  # a batch that runs again for one changed shard keeps the other
    config["publish"] = {"dest": f"s3://{bucket}/datasets"}
    config["s3"] = {"endpoint_url": s3_server.endpoint_url, "region": s3_server.region, "aws_cli": s3_server.aws_cli}
    (root / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    dest = config["publish"]["dest"]

    repo = checkout(tmp_path_factory.mktemp("opt") / "shardsmith")  # where the schedule runs the workflow from
    first, first_jobs, _ = refresh(root, repo)
    v1 = latest_version(dest, "demo", s3_server)
    validated_first = validation_reports(root, config)
    added = grow_sources(data)
    second, second_jobs, _ = refresh(root, repo)
    v2 = latest_version(dest, "demo", s3_server)
    validated = validation_reports(root, config)
    written = shards_written(root, config, ran(second_jobs, "write_shard"))
    time.sleep(1.1)  # mtimes have a resolution of a second on some file systems
    third, third_jobs, third_log = refresh(root, checkout(repo))  # the same workflow, checked out again
    v3 = latest_version(dest, "demo", s3_server)
    versions = list(complete_versions(dest, "demo", s3_server))
    named, named_jobs, _ = refresh(root, repo, "--config", "version=v2")  # as docs/publishing.md and --help say
    return {
        "copies": tmp_path_factory.mktemp("fetched"),
        "root": root,
        "dest": dest,
        "s3": s3_server,
        "v1": v1,
        "v2": v2,
        "added": added,
        "jobs": [first_jobs, second_jobs, third_jobs],
        "runs": [first, second, third],
        "third_log": third_log,
        "validated": validated,
        "validated_first": validated_first,
        "written": written,
        "v3": v3,
        "versions": versions,
        "named": named,
        "named_jobs": named_jobs,
        "v_named": latest_version(dest, "demo", s3_server),
    }


def fetched(r, version) -> Path:
    """Every object of the published version, fetched from the store once (one `aws s3 cp --recursive`, not a
    CLI call an object) into a folder of its own: the bytes the tests below read."""
    folder = r["copies"] / version
    if not folder.exists():
        run(r["s3"], "s3", "cp", "--recursive", "--only-show-errors", f"{r['dest']}/demo/{version}", str(folder))
    return folder


def published_table(r, version, name) -> pd.DataFrame:
    """A table the version publishes as a folder of parquet pieces, read whole (the pieces in name order)."""
    folder = fetched(r, version)
    marker = json.loads((folder / MARKER).read_text())
    pieces = sorted(n for n in marker["files"] if n.startswith(f"{name}/"))
    assert pieces, f"{version} has no {name}/ pieces"
    return pd.concat([pd.read_parquet(folder / p) for p in pieces], ignore_index=True)


def test_the_refresh_runs_only_the_new_and_grown_parts(refreshed):
    first, second, _ = refreshed["jobs"]
    all_parts = ran(first, "download_part")
    assert {"cc3m_style-000000", "cc3m_style-000001", "photos-000000", "legacy-000000", "legacy-000001"} == all_parts
    # The manifest's last part grew, a new manifest part and a new source shard appeared: nothing else ran.
    assert ran(second, "download_part") == {"cc3m_style-000001", "cc3m_style-000002", "legacy-000002"}
    # The first shards hold only records of the unchanged first manifest part: not written or validated again.
    written = refreshed["written"]
    assert written and not {"000000", "000001"} & written
    # Their validation reports stay as the first run wrote them; the rewritten shards were read again. A batch
    # (shards_per_job: 2) that ran for one changed shard kept its other one.
    reports, before = refreshed["validated"], refreshed["validated_first"]
    rewritten = {f"demo-{s}.tar" for s in written}
    kept = {n for n in reports if n in before and reports[n]["mtime_ns"] == before[n]["mtime_ns"]}
    assert kept == set(reports) - rewritten
    assert {"demo-000000.tar", "demo-000001.tar"} <= kept
    assert all(r["loader"] == "open_clip_train.data" and not r["problems"] for r in reports.values())
    assert len(reports) > 2


def test_the_new_version_holds_old_plus_new_records_without_duplicates(refreshed):
    r = refreshed
    assert r["v1"] and r["v2"] and r["v1"] != r["v2"]
    assert r["versions"] == [r["v1"], r["v2"]]  # before the refresh that names its version
    old, new = published_table(r, r["v1"], "manifest.parquet"), published_table(r, r["v2"], "manifest.parquet")
    assert set(old["source_id"]) <= set(new["source_id"])  # every published record stays
    added = new[~new["source_id"].isin(old["source_id"])]
    assert sorted(added["url"].unique()) == sorted(r["added"]["fresh"] + r["added"]["shard"])
    assert len(added) == 6 + 2
    assert not new["source_id"].duplicated().any() and not new["key"].duplicated().any()
    assert not set(added["sha256"]) & set(old["sha256"])  # no published image twice
    rejected = published_table(r, r["v2"], "rejected.parquet")
    dedupe = rejected[rejected["stage"] == "dedupe"]
    assert sorted(dedupe["url"]) == sorted(r["added"]["same_url"] + r["added"]["same_image"])
    assert set(dedupe["reason"]) == {"already_published"}
    stats = json.loads((fetched(r, r["v2"]) / "stats.json").read_text())
    assert stats["input_records"] == stats["published"] + stats["rejected"] == len(new) + len(rejected)
    assert stats["rejected_by_reason"]["dedupe/already_published"] == 2


def test_a_refresh_from_a_fresh_checkout_with_nothing_new_runs_nothing(refreshed):
    third = refreshed["jobs"][2]
    reasons = "\n".join(line for line in refreshed["third_log"].splitlines() if "rule " in line or "reason:" in line)
    assert {rule for rule, _ in third} <= {"plan_parts", "all"}, reasons
    assert refreshed["v3"] == refreshed["v2"]
    assert "nothing changed" in refreshed["runs"][2].stderr or "jobs ran" in refreshed["runs"][2].stderr


def test_build_metadata_is_published_with_each_version(refreshed):
    r = refreshed
    build = json.loads((fetched(r, r["v2"]) / "build.json").read_text())
    marker = json.loads((fetched(r, r["v2"]) / MARKER).read_text())
    assert build["config_fingerprint"].startswith("sha256:") and "paths" not in build["config"]
    assert {"python", "snakemake", "pandas", "pyarrow", "webdataset"} <= set(build["packages"])
    assert {"build.json", "README.md", "sizes.json", "wids-index.json"} <= set(marker["files"])
    assert {n.split("/")[0] for n in marker["files"]} >= {"manifest.parquet", "rejected.parquet"}
    assert marker["previous"] == r["v1"]


def test_credentials_never_appear_in_logs_or_outputs(refreshed):
    r = refreshed
    texts = [p.stdout + p.stderr for p in r["runs"]]
    for path in r["root"].rglob("*"):
        if (
            path.is_file()
            and path.suffix in {".log", ".json", ".yaml", ".md", ".txt", ""}
            and path.stat().st_size < 5_000_000
        ):
            texts.append(path.read_text(errors="replace"))
    version = fetched(r, r["v2"])
    for name in json.loads((version / MARKER).read_text())["files"]:
        if not name.endswith((".tar", ".parquet")):
            texts.append((version / name).read_bytes().decode("utf-8", "replace"))
    assert len(texts) > 20
    for text in texts:
        assert SECRET not in text and KEY_ID not in text


def test_config_values_given_to_the_refresh_wrapper_reach_snakemake(refreshed):
    r = refreshed
    assert r["v_named"] == "v2" and list(complete_versions(r["dest"], "demo", r["s3"])) == [*r["versions"], "v2"]
    assert (r["root"] / "config.yaml").read_text().startswith("dataset: demo")  # the config file is untouched
    assert "publish_dataset" in {rule for rule, _ in r["named_jobs"]} and "jobs ran" in r["named"].stderr
    card = (fetched(r, "v2") / "README.md").read_bytes().decode()
    assert card.startswith("# demo v2")


def test_a_refresh_that_needs_more_upload_jobs_publishes_every_shard(tmp_path):
    """The upload jobs are counted from the shard plan, which a refresh plans again within its run: publishing
    must wait for the new plan, not take the old count and find the new shards' files unsent."""
    photos = tmp_path / "data" / "photos"
    photos.mkdir(parents=True)

    def add_photos(numbers):
        for i in numbers:
            (photos / f"p{i}.jpg").write_bytes(jpeg_bytes((40 + i, 40), (10 * i, 80, 160)))
            (photos / f"p{i}.txt").write_text(f"a photo of a blue square number {i}")

    add_photos(range(2))
    config = {
        "dataset": "grow",
        "version": "auto",
        "paths": {k: str(tmp_path / k) for k in ("raw", "work", "output", "logs")},
        "sources": [{"name": "photos", "type": "folder", "path": str(photos)}],
        "samples_per_shard": 1,
        "validate": {"min_shards": 1},
        "dedupe": {"near": "off"},
        "publish": {"dest": str(tmp_path / "fast"), "shards_per_job": 1},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    cmd = [sys.executable, "-m", "shardsmith", "refresh", "--configfile", "config.yaml", "--workflow-profile", "none"]
    subprocess.run(cmd, cwd=tmp_path, check=True, capture_output=True, timeout=600)
    add_photos(range(2, 4))
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    version = latest_version(str(tmp_path / "fast"), "grow")
    marker = json.loads((tmp_path / "fast" / "grow" / version / MARKER).read_text())
    assert sorted(n for n in marker["files"] if n.endswith(".tar")) == [f"grow-{i:06d}.tar" for i in range(4)]
