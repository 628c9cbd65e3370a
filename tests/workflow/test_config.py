"""A user's own config end to end: only what they must say, the rest from the schema's defaults (nothing
from the demo), YAML or JSON alike, and a run with no config refused with a one-line message."""

import json
import subprocess

import pandas as pd
import pytest
import yaml
from workflow_helpers import REPO, SNAKEMAKE, run_workflow, sha256

from shardsmith.cli.demo import make_demo

pytestmark = pytest.mark.workflow
DATASET = "mine"


def own_config(data) -> dict:
    """What a user must write: the dataset, the folders, one source. Relative folders: under --directory."""
    return {
        "dataset": DATASET,
        "paths": {"raw": "cache", "work": "work", "output": "results"},
        "sources": [
            {"name": "web", "type": "manifest", "path": str(data / "manifest.tsv"), "columns": ["caption", "url"]}
        ],
    }


def run_with(root, configfile) -> subprocess.CompletedProcess:
    root.mkdir(parents=True, exist_ok=True)
    cmd = [
        str(SNAKEMAKE), "-s", str(REPO / "Snakefile"), "--directory", str(root), "--configfile", str(configfile),
        "--workflow-profile", "none", "--cores", "2",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-6000:]
    return proc


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    base = tmp_path_factory.mktemp("own")
    data = base / "data"
    make_demo(data)
    config = own_config(data)
    (base / "mine.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    (base / "mine.json").write_text(json.dumps(config, indent=2))
    run_with(base / "yaml", base / "mine.yaml")
    run_with(base / "json", base / "mine.json")
    return base


def test_a_config_with_only_dataset_paths_and_a_source_builds_with_the_documented_defaults(builds):
    root = builds / "yaml"
    out = root / "results" / DATASET
    assert json.loads((out / "validation.json").read_text())["ok"] is True
    schema = yaml.safe_load((REPO / "config" / "config.schema.yaml").read_text())["properties"]
    # part_size and samples_per_shard: the schema's (thousands), so one part and one shard, which the
    # default validate.min_shards (1) accepts
    assert schema["part_size"]["default"] >= 1000 and schema["samples_per_shard"]["default"] >= 1000
    assert len(list((root / "work" / DATASET / "plan" / "parts").glob("*.parquet"))) == 1
    assert list(json.loads((out / "sizes.json").read_text())) == [f"{DATASET}-000000.tar"]
    # resize.max_side: the schema's 1024, not the demo's 512
    manifest = pd.read_parquet(out / "manifest.parquet")
    max_side = schema["resize"]["properties"]["max_side"]["default"]
    assert manifest[["width", "height"]].max().max() == max_side > 512
    assert (manifest[["width_before", "height_before"]].max(axis=1) > max_side).any()
    # no embedding and no publish: neither is asked for
    assert not (out / "embedding_stats.json").exists() and not (root / "work" / DATASET / "embed").exists()
    assert not (root / "work" / DATASET / "published").exists()
    assert not (REPO / "demo" / "fast-storage" / DATASET).exists()
    stats = json.loads((out / "stats.json").read_text())
    assert (
        stats["input_records"]
        == stats["published"] + stats["rejected"]
        == len(manifest) + len(pd.read_parquet(out / "rejected.parquet"))
    )


def test_the_same_config_as_json_builds_the_same_bytes(builds):
    yaml_out, json_out = builds / "yaml" / "results" / DATASET, builds / "json" / "results" / DATASET
    names = sorted(str(p.relative_to(yaml_out)) for p in yaml_out.rglob("*") if p.is_file())
    assert {"README.md", f"{DATASET}-000000.tar", f"manifest.parquet/{DATASET}-000000.parquet"} <= set(names)
    assert sorted(str(p.relative_to(json_out)) for p in json_out.rglob("*") if p.is_file()) == names
    assert {n: sha256(json_out / n) for n in names} == {n: sha256(yaml_out / n) for n in names}


def test_a_json_config_publishes(builds, tmp_path):
    config = own_config(builds / "data")
    config["publish"] = {"dest": "fast"}
    (tmp_path / "pub.json").write_text(json.dumps(config))
    run_with(tmp_path / "run", tmp_path / "pub.json")
    latest = (tmp_path / "run" / "fast" / DATASET / "latest").read_text().strip()
    version = tmp_path / "run" / "fast" / DATASET / "v1"
    assert latest == "v1" and (version / "README.md").read_text().startswith(f"# {DATASET} v1")
    recorded = json.loads((version / "build.json").read_text())["config"]["sources"]  # with the defaults filled in
    assert recorded == [
        {
            **config["sources"][0],
            "format": "auto",
            "url_column": "url",
            "hash_type": "md5",
            "image_extensions": recorded[0]["image_extensions"],
        }
    ]


def test_a_run_without_a_config_says_how_to_give_one(tmp_path):
    cmd = [
        str(SNAKEMAKE),
        "-s",
        str(REPO / "Snakefile"),
        "--directory",
        str(tmp_path),
        "--workflow-profile",
        "none",
        "-n",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode != 0 and any(
        line.startswith("shardsmith: no config given: run with --configfile") for line in lines
    )
    assert "Traceback" not in proc.stderr


def test_a_config_error_names_the_users_file_only(tmp_path):
    config = {"dataset": DATASET, "paths": {"raw": "c", "work": "w", "output": "o"}, "sources": [], "part_size": 0}
    proc = run_workflow(tmp_path, config, "-n", check=False)
    assert proc.returncode != 0
    hint = [line for line in proc.stderr.splitlines() if "Fix it in" in line]
    assert hint and str(tmp_path / "config.yaml") in hint[0] and "demo.yaml" not in hint[0]
