"""The planning restructure changed no byte: the workflow of the last commit before it (BEFORE) and the working
tree's, run on the same inputs, publish the same files and write the same plan, at one bucket and at many.

The inputs are built once: the demo's three sources and 176 generated photos, 16 of them edited copies of
others (in manifests of their own and at the end of the demo's). A first version (v1) is built and published
to a mounted path by the working tree's workflow; the sources then grow (new photos, published URLs again, a
published image under a new name, edited copies of published photos) and lose three rows, which moves the
rows after them. Each code (BEFORE's Snakefile, the working tree's) downloads and embeds v2's parts once,
which no layout setting changes; each layout's second build (v2) then runs in a folder of its own, from a copy
of its code's parts and against a copy of the same v1: near-duplicates excluded (pHash and the tiny random
CLIP model's embeddings), low CLIP similarity excluded, records already published left out. Then
every published file of v2 and every plan file (shard ranges and parts, the ledger's dropped pieces, the
near-duplicate table) must be byte-identical between the two; the manifest pieces, which carry the score columns
since, must equal BEFORE's in every column of BEFORE's, and the dataset card BEFORE's in every line of data.
"""

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # inherited by snakemake and its jobs: nothing is downloaded

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml
from PIL import Image
from workflow_helpers import REPO, demo_config, run_workflow, sha256, snakemake_cmd

from shardsmith.cli.demo import jpeg, make_demo, scene
from shardsmith.cli.tinyclip import NAME, write_tiny_clip
from shardsmith.storage.stores import MARKER

# The module's fixture runs seven builds (v1, each code's parts, each layout by each code): about 6 minutes alone on
# 2 cores, 12 under `make test`; the limit (pytest-timeout's, which counts a fixture's setup) leaves room for a
# slower machine than this one.
pytestmark = [pytest.mark.workflow, pytest.mark.timeout(1800)]

BEFORE = "033fd1407824922f8ceea9f218f7dbc660033d05"  # 033fd14, the last commit before the planning restructure
PHOTOS, COPY_EVERY, NEW_PHOTOS = 160, 10, 12
# The generated photos go, in three runs, to two manifests of their own (web_a, web_b) and to the end of the demo's
# manifest (cc3m_style); the sources are listed so that at 2 parts a group (part_size 500, bucket_samples 1000)
# each of the 3 groups holds some of them: web_a + legacy-0, legacy-1 + web_b, cc3m_style + photos. Each group
# then leaves some samples out for low CLIP similarity (about a fifth of the generated photos score below
# MIN_SIMILARITY with the tiny model, the demo's samples none). Not only for coverage: a group that leaves out
# none writes its exclusion table with untyped (null) columns, and split_lookups, filtering it by key against a
# published version, fails ("ArrowTypeError: Array type doesn't match type of values set: null vs string"),
# before the restructure and after it alike.
WEB = ("web_a", "web_b")
SOURCE_ORDER = ("web_a", "legacy", "web_b", "cc3m_style", "photos")
PART_SIZE, MIN_SIMILARITY = 500, -0.4
LAYOUTS = {
    "one": {},  # the defaults: one group of parts, one key bucket, one near bucket, one decision round
    # 3 groups (2 parts each), 2 a job; 3 key and 3 near buckets, 2 a job; 2 decision rounds
    "many": {"bucket_samples": 1000, "groups_per_job": 2, "buckets": 3, "buckets_per_job": 2, "decision_rounds": 2},
}


def before_checkout(dest: Path) -> Path:
    """BEFORE's tracked files at `dest` (git archive: the repository's index and work tree are not touched)."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("no git repository to take the commit before the planning restructure from")
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


def write_manifests(data: Path, rows: list[tuple[str, Path]]) -> None:
    """The rows in three consecutive runs: web_a, web_b and the end of the demo's manifest (a near-duplicate may
    be in another manifest than its original)."""
    n = -(-len(rows) // 3)
    runs = ["".join(f"{c}\t{p}\n" for c, p in rows[i * n : (i + 1) * n]) for i in range(3)]
    (data / "web_a.tsv").write_text(runs[0], encoding="utf-8")
    (data / "web_b.tsv").write_text(runs[1], encoding="utf-8")
    demo = data / "manifest.tsv"
    if not (data / "demo.tsv").exists():
        shutil.copy(demo, data / "demo.tsv")  # the demo's own rows, kept for the rewrite after v1
    demo.write_text((data / "demo.tsv").read_text(encoding="utf-8") + runs[2], encoding="utf-8")


def grow(data: Path, rows: list[tuple[str, Path]]) -> None:
    """The sources after v1: new photos, published URLs again, a published image under a new name, edited copies
    of published photos; the first three photos gone from the manifests."""
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
    rows = rows[3:]
    write_manifests(data, rows[:60] + new + rows[60:])


def config_for(data: Path, root: Path, model: tuple[Path, Path], layout: dict, version: str) -> dict:
    model_config, checkpoint = model
    embed = {
        "enabled": True, "model": NAME, "pretrained": str(checkpoint), "model_config": str(model_config),
        "device": "cpu", "workers": 0, "batch_size": 32, "save_embeddings": True, "min_similarity": MIN_SIMILARITY,
    }  # fmt: skip
    config = demo_config(data, root, version=version, part_size=PART_SIZE, samples_per_shard=40, embed=embed)
    # both signals: pHash (the default distance) and the tiny random model's embeddings
    config["dedupe"] = {"near": "exclude", "embedding_min_similarity": 0.997, **layout}
    sources = {s["name"]: s for s in config["sources"]}
    for name in WEB:
        sources[name] = {
            "name": name,
            "type": "manifest",
            "path": str(data / f"{name}.tsv"),
            "columns": ["caption", "url"],
        }
    config["sources"] = [sources[name] for name in SOURCE_ORDER]
    return config


def build(root: Path, config: dict, checkout: Path, *targets: str) -> None:
    """snakemake with `checkout`'s Snakefile; its process and its jobs import `checkout`'s shardsmith (first on
    PYTHONPATH, before the editable install of the working tree)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(checkout), os.getenv("PYTHONPATH")]))}
    cmd = snakemake_cmd(root, "--cores", "2", *targets, snakefile=checkout / "Snakefile")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env, cwd=root)
    assert proc.returncode == 0, f"{checkout}: {proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"


def published_target(root: Path, version: str) -> str:
    """publish_dataset's output (the same path in both codes): a build up to the published version, without the
    report's plots and tables, which are neither published nor compared here."""
    return str(root / "work" / "demo" / "published" / f"{version}.json")


def downloaded_parts(root: Path, config: dict, checkout: Path) -> Path:
    """`checkout`'s plan of parts, and each part downloaded and embedded, in `root`: what a layout's build starts
    from (the rules up to embed_part take no dedupe setting, and a copy keeps the files' times)."""
    work = root / "work" / "demo"
    build(root, config, checkout, str(work / "plan" / "parts"))
    parts = sorted(p.stem for p in (work / "plan" / "parts").glob("*.parquet"))
    build(root, config, checkout, *[str(work / "embed" / f"{p}.parquet") for p in parts])
    return root


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """v1 built once by the working tree; then each layout's v2 by BEFORE and by the working tree, each code's
    from its own parts."""
    base = tmp_path_factory.mktemp("restructure")
    before = before_checkout(base / "before")
    data = base / "data"
    make_demo(data)
    rows = make_photos(data)
    write_manifests(data, rows)
    model = write_tiny_clip(base / "models")
    first = base / "v1"
    run_workflow(first, config_for(data, first, model, {}, "v1"), published_target(first, "v1"))
    grow(data, rows)
    out = {}
    try:
        for code, checkout in (("before", before), ("after", REPO)):
            parts = base / "parts" / code
            downloaded_parts(parts, config_for(data, parts, model, {}, "v2"), checkout)
            for layout, dedupe in LAYOUTS.items():
                root = base / layout / code
                shutil.copytree(parts, root, ignore=shutil.ignore_patterns(".snakemake"))
                shutil.copytree(first / "fast-storage", root / "fast-storage")  # the same v1 to dedupe against
                build(root, config_for(data, root, model, dedupe, "v2"), checkout, published_target(root, "v2"))
                out[layout, code] = root
        yield out
    finally:
        shutil.rmtree(before)


def files(folder: Path) -> dict[str, str]:
    """{path relative to folder: sha256} of every file, sub-folders (parquet pieces, .nv-meta/) included."""
    return {str(p.relative_to(folder)): sha256(p) for p in sorted(folder.rglob("*")) if p.is_file()}


def published(root: Path) -> Path:
    return root / "fast-storage" / "demo" / "v2"


def plan_files(root: Path) -> dict[str, str]:
    """The plan: each shard's ranges and parts (and the near-duplicate table and counts plan_shards copies
    there), the ledger's pieces of dropped records a group, the near-duplicate decision and the cells it
    searched, where the steps' jobs write them or plan_in_one_job does (plan/one_job/: a small dataset). Not
    Snakemake's .snakemake_timestamp of the plan/shards folder."""
    plan = root / "work" / "demo" / "plan"
    steps = plan / "one_job" if (plan / "one_job").exists() else plan
    kept = [*(plan / "shards").iterdir(), *(steps / "dropped").glob("*/*.parquet"), *(steps / "near").glob("*.*")]
    return {
        str(p.relative_to(plan if p.parent.name == "shards" else steps)): sha256(p)
        for p in sorted(kept)
        if p.is_file() and p.name[0] != "."
    }


def comparable_build(version: Path) -> dict:
    """build.json less what names the code: `code` (a sha256 a source file) and `code_fingerprint` differ
    because the code does; the config, its fingerprint, the package versions and the language model stay."""
    build = json.loads((version / "build.json").read_text())
    assert {"code", "code_fingerprint"} <= set(build)
    return {k: v for k, v in build.items() if k not in ("code", "code_fingerprint")}


def comparable_marker(version: Path) -> dict:
    """_COMPLETE.json less `published_at` (the publish time, the one time a version keeps), build.json's sha256
    and size (the code's hashes in it differ, above), the manifest pieces' (their score columns came after
    BEFORE: compared by same_manifest_piece), the ledger's (compared by same_ledger_piece) and the card's
    (compared by card_data); every other file's sha256 and size stay."""
    marker = json.loads((version / MARKER).read_text())
    assert marker.pop("published_at") and marker["files"].pop("build.json") and marker["files"].pop("README.md")
    for name in [n for n in marker["files"] if n.startswith(("manifest.parquet/", "rejected.parquet/"))]:
        del marker["files"][name]
    return marker


def same_manifest_piece(before: Path, after: Path) -> bool:
    """The working tree's manifest piece is BEFORE's with the shard's score columns after its own (the score
    tables' columns, equal to the published score table's values)."""
    a, b = pd.read_parquet(before), pd.read_parquet(after)
    scores = pd.read_parquet(after.parent.parent / after.name.replace(".parquet", ".scores.parquet"))
    extra = [c for c in b.columns if c not in a.columns]
    assert extra == [c for c in scores.columns if c != "key"], (extra, list(scores.columns))
    got = b.set_index("key").loc[scores["key"], extra].to_numpy(np.float64)
    assert np.array_equal(got, scores[extra].to_numpy(np.float64), equal_nan=True)
    return b[list(a.columns)].equals(a) and pq.read_schema(after).names[: len(a.columns)] == list(a.columns)


def same_ledger_piece(before: Path, after: Path) -> bool:
    """The working tree's ledger piece is BEFORE's row for row, but for the detail of an image over
    resize.max_decode_pixels: the workflow checks that setting itself and names it, where BEFORE gave Pillow's
    own message for its limit (equal to the setting's default)."""
    a, b = pd.read_parquet(before), pd.read_parquet(after)
    if list(a.columns) != list(b.columns) or len(a) != len(b):
        return False
    bomb = a["reason"] == "decompression_bomb"
    rest = [c for c in a.columns if c != "detail"]
    return (
        a[rest].equals(b[rest])
        and a.loc[~bomb, "detail"].equals(b.loc[~bomb, "detail"])
        and a.loc[bomb, "detail"].str.contains("decompression bomb").all()
        and b.loc[bomb, "detail"].str.contains("> max_decode_pixels").all()
    )


def card_data(card: Path) -> list[str]:
    """The dataset card's lines that state the build's data, less the wording that follows the code: the Files
    table (every file of the version since), the training command's batch size (at most the samples a loader
    worker gets since) and the near-duplicate keep order's sentence (which now names every step)."""
    lines = card.read_text().split("\n")
    lines = lines[: lines.index("## Files")]
    lines = [re.sub(r"--batch-size \d+", "--batch-size N", line) for line in lines]
    return [line for line in lines if not line.startswith("of each group is kept (")]


def equal(x, y) -> bool:
    """Two cells the same: NaN equals NaN, lists and arrays by their items."""
    if isinstance(x, (list, np.ndarray)) or isinstance(y, (list, np.ndarray)):
        return bool(np.array_equal(np.asarray(x, dtype=object), np.asarray(y, dtype=object)))
    return x == y or (x != x and y != y)


def difference(a: Path, b: Path) -> str:
    """How two files differ, for the failure message: parquet decoded (schema, rows, the first differing row of
    each column), text as its first differing lines, else the sizes."""
    if a.suffix == ".parquet":
        ta, tb = pd.read_parquet(a), pd.read_parquet(b)
        types = [dict(t.dtypes.astype(str)) for t in (ta, tb)]
        if list(types[0].items()) != list(types[1].items()) or len(ta) != len(tb):
            return f"{a.name}: columns {types[0]} / {types[1]}, rows {len(ta)} / {len(tb)}"
        lines = []
        for col in ta.columns:
            same = [equal(x, y) for x, y in zip(ta[col].tolist(), tb[col].tolist(), strict=True)]
            if not all(same):
                row = same.index(False)
                lines.append(f"  {col}: {sum(not s for s in same)} rows differ, first row {row}: "
                             f"{ta[col].iloc[row]!r} / {tb[col].iloc[row]!r}")  # fmt: skip
        return f"{a.name}: same values, other bytes (metadata)" if not lines else f"{a.name}:\n" + "\n".join(lines)
    try:
        la, lb = a.read_text().splitlines(), b.read_text().splitlines()
    except UnicodeDecodeError:
        return f"{a.name}: {a.stat().st_size} / {b.stat().st_size} bytes"
    diff = [f"  {i}: {x!r} / {y!r}" for i, (x, y) in enumerate(zip(la, lb, strict=False)) if x != y][:5]
    return f"{a.name}: {len(la)} / {len(lb)} lines\n" + "\n".join(diff)


def explain(a: Path, b: Path, names: list[str]) -> str:
    return "before / after differ:\n" + "\n".join(difference(a / n, b / n) for n in names)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_published_files_are_byte_identical(builds, layout):
    a, b = (published(builds[layout, code]) for code in ("before", "after"))
    fa, fb = files(a), files(b)
    assert set(fa) == set(fb)
    assert {"README.md", "sizes.json", "stats.json", "embedding_stats.json", "manifest.parquet/demo-000000.parquet",
            "rejected.parquet/000000.parquet", ".nv-meta/index.sqlite", "demo-000000.scores.parquet",
            "demo-000000.embeddings.npz", "demo-000000.idx", "demo-000000.tar.idx"} <= set(fa)  # fmt: skip
    differ = sorted(name for name in fa if fa[name] != fb[name])
    scored = [n for n in differ if n.startswith("manifest.parquet/")]
    assert scored and all(same_manifest_piece(a / n, b / n) for n in scored)
    ledger = [n for n in differ if n.startswith("rejected.parquet/")]
    assert all(same_ledger_piece(a / n, b / n) for n in ledger), explain(a, b, ledger)
    if "README.md" in differ:
        assert card_data(a / "README.md") == card_data(b / "README.md"), explain(a, b, ["README.md"])
    differ = [n for n in differ if n not in [*scored, *ledger, "README.md"]]
    # the code's hashes, and the publish time: compared below
    assert differ == ["_COMPLETE.json", "build.json"], explain(
        a, b, [n for n in differ if n not in ("_COMPLETE.json", "build.json")]
    )
    assert comparable_build(a) == comparable_build(b)
    assert comparable_marker(a) == comparable_marker(b)
    assert (a.parent / "latest").read_text() == (b.parent / "latest").read_text() == "v2\n"


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_plan_files_are_byte_identical(builds, layout):
    roots = [builds[layout, code] / "work" / "demo" / "plan" for code in ("before", "after")]
    a, b = (plan_files(builds[layout, code]) for code in ("before", "after"))
    assert {"near/near_duplicates.parquet", "shards/near_duplicates.parquet", "shards/demo-000000.parts",
            "shards/demo-000000.ranges.json"} <= set(a)  # fmt: skip
    assert sorted(a) == sorted(b)
    differ = [name for name in a if a[name] != b[name]]
    assert differ == [], explain(*roots, differ)


def test_the_builds_run_the_code_and_the_layouts_they_claim_and_find_what_is_compared(builds):
    for layout in LAYOUTS:
        code = {c: json.loads((published(builds[layout, c]) / "build.json").read_text())["code"] for c in
                ("before", "after")}  # fmt: skip
        assert "shardsmith/shards/layout.py" in code["after"] and "shardsmith/shards/layout.py" not in code["before"]
    for code in ("before", "after"):
        logs = {layout: builds[layout, code] / "logs" / "demo" for layout in LAYOUTS}
        for rule, one, many in (("split_keys", 1, 2), ("find_duplicate_keys", 1, 2), ("find_near_pairs", 1, 2)):
            assert len(list((logs["one"] / rule).glob("*.log"))) == one, (code, rule)
            assert len(list((logs["many"] / rule).glob("*.log"))) == many, (code, rule)
        assert len(list((builds["many", code] / "work" / "demo" / "plan" / "dropped").glob("*/*.parquet"))) == 3
    # the working tree plans the one-group, one-bucket layout in plan_shards' job, the many-group one in a job a
    # step: each step's log says which job it ran in
    for layout, one_job in (("one", True), ("many", False)):
        root = builds[layout, "after"]
        assert (root / "work" / "demo" / "plan" / "one_job" / "dropped").is_dir() == one_job
        plan_log = (root / "logs" / "demo" / "plan_shards.log").read_text()
        assert ("find_near_pairs slice=00000: log" in plan_log) == one_job
    for layout in LAYOUTS:
        root = builds[layout, "after"]
        rejected = pd.read_parquet(published(root) / "rejected.parquet")
        reasons = rejected.groupby(["stage", "reason"]).size().to_dict()
        assert reasons[("dedupe", "already_published")] >= 3 and reasons[("embed", "low_similarity")] >= 4
        near = rejected[rejected["reason"] == "near_duplicate"]
        assert near["detail"].str.contains(r"\(published in v1\)").sum() >= 3
        assert near["detail"].str.contains("pHash").any() and near["detail"].str.contains("CLIP").any()
