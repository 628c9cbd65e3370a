"""The planning restructure changed no byte: the workflow of the last commit before it (BEFORE) and the working
tree's, run on the same inputs, publish the same files and write the same plan, at one bucket and at many.

The inputs are built once: the demo's three sources and a manifest of generated photos with near-duplicate
copies. A first version (v1) is built and published to a mounted path by the working tree's workflow; the
sources then grow (new photos, a published URL again, a published image under a new name, edited copies of
published photos) and lose a few records. Each layout's second build (v2), once with BEFORE's Snakefile and
once with the working tree's, runs in a folder of its own against a copy of the same v1: near-duplicates
excluded (pHash and the tiny random CLIP model's embeddings), low CLIP similarity excluded, records already
published left out. Then every published file of v2 and every plan file (shard ranges and parts, the ledger's
dropped pieces, the near-duplicate table) must be byte-identical between the two.
"""

import json
import os
import shutil
import subprocess
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # inherited by snakemake and its jobs: nothing is downloaded

import numpy as np
import pandas as pd
import pytest
import yaml
from PIL import Image
from workflow_helpers import REPO, demo_config, run_workflow, sha256, snakemake_cmd

from shardsmith.cli.demo import jpeg, make_demo, scene
from shardsmith.cli.tinyclip import NAME, write_tiny_clip
from shardsmith.storage.stores import MARKER

pytestmark = pytest.mark.workflow

BEFORE = "033fd1407824922f8ceea9f218f7dbc660033d05"  # 033fd14, the last commit before the planning restructure
PHOTOS, COPY_EVERY, NEW_PHOTOS = 200, 10, 12
LAYOUTS = {
    "one": {},  # the defaults: one group of parts, one key bucket, one near bucket, one decision round
    # every part a group (bucket_samples / part_size = 1), two groups a job; 3 buckets two a job; 2 rounds
    "many": {"bucket_samples": 1000, "groups_per_job": 2, "buckets": 3, "buckets_per_job": 2, "decision_rounds": 2},
}
PART_SIZE = 1000  # a part a source (the legacy shards: one a source shard), so the many layout has 4-5 groups


def before_checkout(dest: Path) -> Path:
    """BEFORE's tracked files at `dest` (git archive: the repository's index and work tree are not touched)."""
    probe = subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{BEFORE}^{{commit}}"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"commit {BEFORE[:7]} (the last before the planning restructure) is not in this clone")
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", BEFORE], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest


def edited(kind: str, img: Image.Image) -> Image.Image:
    w, h = img.size
    if kind == "mirrored":
        return img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    if kind == "cropped":
        return img.crop((2, 2, w - 2, h - 2))
    return img.resize((w * 3 // 4, h * 3 // 4), Image.Resampling.LANCZOS)


def make_photos(data: Path) -> list[tuple[str, Path]]:
    """PHOTOS generated photos, every COPY_EVERY-th followed by an edited copy of it: (caption, path) rows."""
    folder = data / "web"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(7)
    rows = []
    for i in range(PHOTOS):
        img = scene(rng, 192, 144)
        rows.append((f"Generated photo number {i}", folder / f"photo_{i:03d}.jpg"))
        rows[-1][1].write_bytes(jpeg(img, quality=90))
        if i % COPY_EVERY == 0:
            kind = ("mirrored", "cropped", "resized")[(i // COPY_EVERY) % 3]
            rows.append((f"Generated photo number {i}, {kind}", folder / f"copy_{i:03d}.jpg"))
            rows[-1][1].write_bytes(jpeg(edited(kind, img), quality=80))
    return rows


def write_manifest(data: Path, rows: list[tuple[str, Path]]) -> None:
    (data / "web.tsv").write_text("".join(f"{c}\t{p}\n" for c, p in rows), encoding="utf-8")


def grow(data: Path, rows: list[tuple[str, Path]]) -> None:
    """The sources after v1: new photos, published URLs again, a published image under a new name, edited copies
    of published photos; the first three photos gone from the manifest."""
    folder = data / "web"
    rng = np.random.default_rng(8)
    new = []
    for i in range(NEW_PHOTOS):
        new.append((f"A new photo number {i}", folder / f"new_{i:03d}.jpg"))
        new[-1][1].write_bytes(jpeg(scene(rng, 200, 150), quality=90))
    for i, kind in zip((11, 22, 33), ("mirrored", "cropped", "resized"), strict=True):
        original = Image.open(folder / f"photo_{i:03d}.jpg").convert("RGB")
        new.append((f"Published photo {i}, {kind} again", folder / f"again_{i:03d}.jpg"))
        new[-1][1].write_bytes(jpeg(edited(kind, original), quality=85))
    shutil.copy(folder / "photo_044.jpg", folder / "renamed_044.jpg")
    new.append(("Published photo 44 under a new name", folder / "renamed_044.jpg"))
    new += [("Published photo 55 again", folder / "photo_055.jpg"), rows[70]]
    write_manifest(data, rows[3:] + new)


def config_for(data: Path, root: Path, model: tuple[Path, Path], layout: dict, version: str) -> dict:
    model_config, checkpoint = model
    embed = {
        "enabled": True, "model": NAME, "pretrained": str(checkpoint), "model_config": str(model_config),
        "device": "cpu", "workers": 0, "batch_size": 32, "save_embeddings": True, "min_similarity": -0.4,
    }  # fmt: skip
    dedupe = {"near": "exclude", "embedding_min_similarity": 0.998, **layout}
    config = demo_config(data, root, version=version, part_size=PART_SIZE, samples_per_shard=40, embed=embed)
    config["dedupe"] = dedupe
    config["sources"].append(
        {"name": "web", "type": "manifest", "path": str(data / "web.tsv"), "columns": ["caption", "url"]}
    )
    return config


def build(root: Path, config: dict, checkout: Path) -> None:
    """snakemake with `checkout`'s Snakefile; its process and its jobs import `checkout`'s shardsmith."""
    (root / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(checkout), os.getenv("PYTHONPATH")]))}
    cmd = snakemake_cmd(root, "--cores", "2", snakefile=checkout / "Snakefile")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=root)
    assert proc.returncode == 0, f"{checkout}: {proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    base = tmp_path_factory.mktemp("restructure")
    before = before_checkout(base / "before")
    data = base / "data"
    make_demo(data)
    rows = make_photos(data)
    write_manifest(data, rows)
    model = write_tiny_clip(base / "models")
    first = base / "v1"
    run_workflow(first, config_for(data, first, model, {}, "v1"))
    grow(data, rows)
    out = {}
    for layout, dedupe in LAYOUTS.items():
        for code, checkout in (("before", before), ("after", REPO)):
            root = base / layout / code
            shutil.copytree(first / "fast-storage", root / "fast-storage")  # the same v1 to dedupe against
            build(root, config_for(data, root, model, dedupe, "v2"), checkout)
            out[layout, code] = root
    yield out
    shutil.rmtree(before)


def files(folder: Path) -> dict[str, str]:
    """{path relative to folder: sha256} of every file, sub-folders (parquet pieces, .nv-meta/) included."""
    return {str(p.relative_to(folder)): sha256(p) for p in sorted(folder.rglob("*")) if p.is_file()}


def plan_files(root: Path) -> dict[str, str]:
    plan = root / "work" / "demo" / "plan"
    kept = [*(plan / "shards").iterdir(), *(plan / "dropped").glob("*/*.parquet"), *(plan / "near").glob("*.*")]
    return {str(p.relative_to(plan)): sha256(p) for p in sorted(kept) if p.is_file()}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_published_files_are_byte_identical(builds, layout):
    a, b = (builds[layout, code] / "fast-storage" / "demo" / "v2" for code in ("before", "after"))
    assert files(a) == files(b)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_plan_files_are_byte_identical(builds, layout):
    a, b = (plan_files(builds[layout, code]) for code in ("before", "after"))
    assert a == b
