"""Near-duplicates end to end: copies of generated photos (resized, recompressed, cropped 1% a side,
mirrored) are grouped with their original; with `exclude` they land in the ledger with the kept key and the
ledger adds up, a rebuild keeps the same samples, a refresh finds copies of already published photos, the
report and the card show them, and the semantic path runs with the tiny CLIP model."""

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from workflow_helpers import demo_config, run_workflow, sha256

from shardsmith.cli.demo import jpeg, scene
from shardsmith.cli.tinyclip import NAME, write_tiny_clip
from shardsmith.shards.nearparts import CAPTION_STEP
from tests.workflow.test_cluster import file_hashes

pytestmark = pytest.mark.workflow

COPIES = {
    "resized": lambda im: im.resize((320, 240), Image.Resampling.LANCZOS),
    "recompressed": lambda im: im,  # saved at quality 50 below
    "cropped": lambda im: im.crop((6, 5, 634, 475)),
    "mirrored": lambda im: im.transpose(Image.Transpose.FLIP_LEFT_RIGHT),
}


def make_data(data: Path, originals: bool = True, copies: bool = True) -> dict[str, str]:
    """A TSV manifest of six distinct photos, then one copy of each of the first four; returns the caption
    of every copy -> the caption of its original."""
    (data / "images").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(21)
    photos = [scene(rng, 640, 480) for _ in range(6)]
    rows, copy_of = [], {}
    for i, img in enumerate(photos):
        (data / "images" / f"photo_{i}.jpg").write_bytes(jpeg(img, quality=92))
        if originals:
            rows.append(f"Photo number {i}\t{data / 'images' / f'photo_{i}.jpg'}\n")
    for i, (kind, make) in enumerate(COPIES.items()):
        path = data / "images" / f"{kind}_{i}.jpg"
        path.write_bytes(jpeg(make(photos[i]), quality=50 if kind == "recompressed" else 88))
        if copies:
            rows.append(f"Photo number {i}, {kind}\t{path}\n")
        copy_of[f"Photo number {i}, {kind}"] = f"Photo number {i}"
    (data / "manifest.tsv").write_text("".join(rows), encoding="utf-8")
    return copy_of


def config_for(data: Path, root: Path, **dedupe) -> dict:
    config = demo_config(data, root, samples_per_shard=3)
    config["sources"] = [
        {"name": "web", "type": "manifest", "path": str(data / "manifest.tsv"), "columns": ["caption", "url"]}
    ]
    config["dedupe"] = {"near": "exclude", **dedupe}
    return config


def published(root: Path, version: str = "v1") -> tuple[pd.DataFrame, pd.DataFrame, dict]:
    out = root / "fast-storage" / "demo" / version
    stats = json.loads((out / "stats.json").read_text())
    return pd.read_parquet(out / "manifest.parquet"), pd.read_parquet(out / "rejected.parquet"), stats


def captions(root: Path, manifest: pd.DataFrame) -> dict[str, str]:
    """key -> caption of the published samples, from the shards' json members' source fields."""
    import tarfile

    out = {}
    for tar in sorted((root / "output" / "demo").glob("demo-*.tar")):
        with tarfile.open(tar) as t:
            for m in t:
                if m.name.endswith(".txt"):
                    out[m.name[:-4]] = t.extractfile(m).read().decode()
    return {k: out[k] for k in manifest["key"]}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("near")
    copy_of = make_data(root / "data")
    run_workflow(root, config_for(root / "data", root))
    return root, copy_of


def test_copies_are_left_out_for_their_original_and_the_ledger_adds_up(built):
    root, copy_of = built
    manifest, rejected, stats = published(root)
    kept = captions(root, manifest)
    assert sorted(kept.values()) == [f"Photo number {i}" for i in range(6)]  # every original, no copy
    near = rejected[rejected["reason"] == "near_duplicate"]
    assert set(near["stage"]) == {"dedupe"} and len(near) == len(copy_of) == 4
    key_of = {c: k for k, c in kept.items()}
    urls = {Path(u).stem: d for u, d in zip(near["url"], near["detail"], strict=True)}
    for i, kind in enumerate(COPIES):
        assert urls[f"{kind}_{i}"].startswith(f"near-duplicate of {key_of[f'Photo number {i}']}: pHash distance ")
    assert stats["input_records"] == stats["published"] + stats["rejected"] == len(manifest) + len(rejected) == 10
    assert stats["rejected_by_reason"]["dedupe/near_duplicate"] == 4
    sizes = json.loads((root / "output" / "demo" / "sizes.json").read_text())
    assert sorted(sizes.values()) == [3, 3]  # shards stay uniform


def test_a_rebuild_keeps_the_same_samples_and_bytes(built):
    root, _ = built
    out = root / "output" / "demo"
    before = {p.name: sha256(p) for p in sorted(out.glob("demo-*.tar"))}
    keys = published(root)[0]["key"].tolist()
    shutil.rmtree(root / "fast-storage")
    run_workflow(root, config_for(root / "data", root), "--forceall")
    assert {p.name: sha256(p) for p in sorted(out.glob("demo-*.tar"))} == before
    assert published(root)[0]["key"].tolist() == keys


def test_the_report_and_the_card_show_the_groups(built):
    root, _ = built
    card = (root / "output" / "demo" / "README.md").read_text()
    assert "## Near-duplicates" in card and "fall in 4 groups" in card and "the other 4 are left out" in card
    run_workflow(root, config_for(root / "data", root), "--report", str(root / "report.html"))
    sheet = Image.open(root / "work" / "demo" / "report" / "near_pairs.png")
    assert sheet.height >= 4 * 160  # four example pairs, one a row
    assert (root / "work" / "demo" / "report" / "near_distances.png").stat().st_size > 10_000


def test_report_mode_leaves_every_sample_in(tmp_path):
    make_data(tmp_path / "data")
    run_workflow(tmp_path, config_for(tmp_path / "data", tmp_path, near="report"))
    manifest, rejected, _ = published(tmp_path)
    assert len(manifest) == 10 and "dedupe" not in set(rejected["stage"])
    found = pd.read_parquet(tmp_path / "work" / "demo" / "plan" / "shards" / "near_duplicates.parquet")
    assert len(found) == 4 and set(found["signal"]) == {"phash"}


def test_a_refresh_finds_copies_of_photos_published_before(tmp_path):
    """A folder source: v1 publishes the originals; they then leave the folder and copies arrive, so v2 holds
    only new records, each a copy of a photo that only the published v1 still has."""
    make_data(tmp_path / "made")
    folder = tmp_path / "photos"
    folder.mkdir()
    for i in range(6):
        shutil.copy(tmp_path / "made" / "images" / f"photo_{i}.jpg", folder / f"photo_{i}.jpg")
        (folder / f"photo_{i}.txt").write_text(f"Photo number {i}")
    config = config_for(tmp_path / "made", tmp_path)
    config["sources"] = [{"name": "photos", "type": "folder", "path": str(folder)}]
    config["samples_per_shard"] = 1  # v2 publishes two samples: two shards
    run_workflow(tmp_path, config)
    v1 = published(tmp_path)[0]
    for i, kind in enumerate(COPIES):
        (folder / f"photo_{i}.jpg").unlink()
        (folder / f"photo_{i}.txt").unlink()
        shutil.copy(tmp_path / "made" / "images" / f"{kind}_{i}.jpg", folder / f"{kind}_{i}.jpg")
        (folder / f"{kind}_{i}.txt").write_text(f"Photo number {i}, {kind}")
    run_workflow(tmp_path, {**config, "version": "v2"}, "--forcerun", "plan_parts")
    manifest, rejected, stats = published(tmp_path, "v2")
    assert sorted(Path(u).name for u in manifest["url"]) == ["photo_4.jpg", "photo_5.jpg"]
    near = rejected[rejected["reason"] == "near_duplicate"]
    assert sorted(Path(u).name for u in near["url"]) == sorted(f"{k}_{i}.jpg" for i, k in enumerate(COPIES))
    kept = dict(zip(v1["url"].map(lambda u: Path(u).name), v1["key"], strict=True))
    for url, detail in zip(near["url"], near["detail"], strict=True):
        i = Path(url).stem.split("_")[1]
        assert detail.startswith(f"near-duplicate of {kept[f'photo_{i}.jpg']} (published in v1): pHash distance ")
    assert stats["input_records"] == len(manifest) + len(rejected) == 6


def test_the_semantic_signal_runs_with_the_tiny_model_and_best_caption_keeps_the_caption_that_matches(tmp_path):
    """Both signals, keep: best_caption: each copy set keeps its sample whose caption scored highest (in steps
    of CAPTION_STEP; within a step, the larger image), as embed_part's score tables say."""
    data = tmp_path / "data"
    make_data(data)
    model_config, checkpoint = write_tiny_clip(tmp_path / "models")
    config = config_for(data, tmp_path, phash_max_distance=0, embedding_min_similarity=0.995, keep="best_caption")
    config["embed"] = {"enabled": True, "model": NAME, "pretrained": str(checkpoint), "model_config": str(model_config),
                       "device": "cpu", "workers": 0, "batch_size": 8}  # fmt: skip
    run_workflow(tmp_path, config)
    found = pd.read_parquet(tmp_path / "work" / "demo" / "plan" / "shards" / "near_duplicates.parquet")
    emb = {}
    for f in sorted((tmp_path / "work" / "demo" / "embed").glob("*.npz")):
        with np.load(f) as z:
            emb.update(zip(z["key"], z["image"].astype(np.float32), strict=True))
    semantic = found[found["signal"] == "embedding"]
    assert len(semantic), found
    for r in semantic.to_dict("records"):
        assert float(emb[r["key"]] @ emb[r["kept_key"]]) == pytest.approx(r["distance"], abs=2e-3)
        assert r["distance"] >= 0.995
    scores = pd.concat(pd.read_parquet(f) for f in sorted((tmp_path / "work" / "demo" / "embed").glob("*.parquet")))
    similarity = dict(zip(scores["key"], scores.filter(like="similarity_score").iloc[:, 0], strict=True))
    samples = pd.concat(
        pd.read_parquet(f) for f in sorted((tmp_path / "work" / "demo").glob("processed/*.samples.parquet"))
    )
    area = dict(zip(samples["key"], samples["width_before"] * samples["height_before"], strict=True))
    step = {k: np.floor((v + 1) / CAPTION_STEP + 1e-9) for k, v in similarity.items()}
    for r in found.to_dict("records"):
        assert (step[r["kept_key"]], area[r["kept_key"]]) >= (step[r["key"]], area[r["key"]])
    assert any(step[r["kept_key"]] > step[r["key"]] and area[r["kept_key"]] < area[r["key"]]
               for r in found.to_dict("records")) or len(set(step.values())) == 1  # fmt: skip
    settings = json.loads((tmp_path / "work" / "demo" / "plan" / "shards" / "near_duplicates.json").read_text())
    assert settings["settings"]["keep"] == "best_caption"
    _, rejected, stats = published(tmp_path)
    assert stats["rejected_by_reason"].get("dedupe/near_duplicate", 0) == len(found)
    assert stats["input_records"] == stats["published"] + stats["rejected"] == 10
    assert "CLIP image cosine similarity" in " ".join(rejected["detail"])


def reference_folder(data: Path, folder: Path) -> None:
    """The four copies make_data writes (resized, recompressed, cropped, mirrored; photos 0-3), and three photos
    of other scenes, as an evaluation set's folder."""
    folder.mkdir(parents=True)
    for i, kind in enumerate(COPIES):
        shutil.copy(data / "images" / f"{kind}_{i}.jpg", folder / f"{kind}_{i}.jpg")
    rng = np.random.default_rng(99)
    for i in range(3):
        (folder / f"other_{i}.jpg").write_bytes(jpeg(scene(rng, 640, 480), quality=90))


def reference_shards(folder: Path, shard: Path) -> None:
    import tarfile

    with tarfile.open(shard, "w") as tar:
        for p in sorted(folder.iterdir()):
            tar.add(p, arcname=p.name)


@pytest.mark.parametrize("near", ["report", "exclude"])
def test_training_samples_near_an_evaluation_set_are_left_out_naming_the_reference(tmp_path, near):
    """The originals of the four planted copies are left out as dedupe/near_reference (with near: report too),
    none of the rest; planned a job a step, a rebuild elsewhere is byte-identical; the set as tar shards leaves
    out the same samples; a set with no image stops the build, naming it."""
    make_data(tmp_path / "data", copies=False)  # the six originals only; the copies are the evaluation set
    reference_folder(tmp_path / "data", tmp_path / "eval" / "val")
    config = config_for(tmp_path / "data", tmp_path / "a", near=near)
    config["samples_per_shard"] = 1  # two published samples: two shards, as OpenCLIP needs
    config["evaluation_sets"] = [{"name": "val", "path": str(tmp_path / "eval" / "val")}]
    if near == "exclude":  # planned by a job a step: two sources, so two parts, two groups and two buckets
        lines = (tmp_path / "data" / "manifest.tsv").read_text().splitlines(keepends=True)
        (tmp_path / "data" / "first.tsv").write_text("".join(lines[:3]))
        (tmp_path / "data" / "second.tsv").write_text("".join(lines[3:]))
        config["sources"] = [{**config["sources"][0], "name": n, "path": str(tmp_path / "data" / f"{n}.tsv")}
                             for n in ("first", "second")]  # fmt: skip
        config["part_size"] = 1000
        config["dedupe"].update(bucket_samples=1000, buckets=2)
    run_workflow(tmp_path / "a", config)
    manifest, rejected, stats = published(tmp_path / "a")
    assert sorted(captions(tmp_path / "a", manifest).values()) == ["Photo number 4", "Photo number 5"]
    refs = rejected[rejected["reason"] == "near_reference"]
    assert set(refs["stage"]) == {"dedupe"} and len(refs) == 4 == len(rejected)
    by_photo = {Path(u).stem: d for u, d in zip(refs["url"], refs["detail"], strict=True)}
    for i, kind in enumerate(COPIES):
        assert re.fullmatch(
            rf"near reference image val/{kind}_{i}\.jpg \(evaluation set val\): pHash distance \d of 64 bits",
            by_photo[f"photo_{i}"],
        )
    assert stats["input_records"] == stats["published"] + stats["rejected"] == 6
    one_job = (tmp_path / "a" / "work" / "demo" / "plan" / "one_job").exists()
    assert one_job == (near == "report")
    counts = json.loads((tmp_path / "a" / "work" / "demo" / "plan" / "shards" / "near_duplicates.json").read_text())
    assert counts["near_reference"] == 4
    card = (tmp_path / "a" / "output" / "demo" / "README.md").read_text()
    assert "Of those, 4 are near an image of an evaluation set" in card
    if near == "exclude":  # a rebuild elsewhere, planned a job a step: every published file the same
        again = tmp_path / "again"
        config["paths"] = {k: str(again / k) for k in ("raw", "work", "output", "logs")}
        config["publish"] = {"dest": str(again / "fast-storage")}
        run_workflow(again, config)
        versions = [root / "fast-storage" / "demo" / "v1" for root in (tmp_path / "a", again)]
        assert file_hashes(versions[0]) == file_hashes(versions[1])
        return
    reference_shards(tmp_path / "eval" / "val", tmp_path / "eval" / "val-000000.tar")
    config = config_for(tmp_path / "data", tmp_path / "b", near=near)
    config["samples_per_shard"] = 1
    config["evaluation_sets"] = [{"name": "val", "path": str(tmp_path / "eval" / "val-{000000..000000}.tar")}]
    run_workflow(tmp_path / "b", config)
    assert sorted(published(tmp_path / "b")[1]["source_id"]) == sorted(refs["source_id"])
    (tmp_path / "eval" / "empty").mkdir()
    config = config_for(tmp_path / "data", tmp_path / "c", near=near)
    config["samples_per_shard"] = 1
    config["evaluation_sets"] = [{"name": "val", "path": str(tmp_path / "eval" / "empty")}]
    proc = run_workflow(tmp_path / "c", config, check=False)  # a wrong or unmounted path: it would leave out none
    assert proc.returncode != 0 and "shardsmith: evaluation set val: no image could be read from" in proc.stderr
    assert not (tmp_path / "c" / "fast-storage" / "demo").exists()


def test_with_embeddings_an_evaluation_sets_reshot_images_are_found_by_their_clip_embedding(tmp_path):
    """Crops of a quarter a side (no pHash near) of three photos as the evaluation set, the tiny model's
    embeddings as a signal: the references are embedded as a part is (embed_references), and exactly the
    samples whose embedding is at or over the threshold with a reference's (computed here from both tables)
    are left out as near_reference naming it and the similarity; none of the rest."""
    make_data(tmp_path / "data", copies=False)
    rng = np.random.default_rng(21)
    photos = [scene(rng, 640, 480) for _ in range(3)]  # make_data's first three, drawn alike
    (tmp_path / "eval").mkdir()
    for i, im in enumerate(photos):
        (tmp_path / "eval" / f"crop_{i}.jpg").write_bytes(jpeg(im.crop((160, 120, 480, 360)), quality=95))
    model_config, checkpoint = write_tiny_clip(tmp_path / "models")
    threshold = 0.99
    config = config_for(tmp_path / "data", tmp_path, phash_max_distance=0, embedding_min_similarity=threshold)
    config["embed"] = {"enabled": True, "model": NAME, "pretrained": str(checkpoint), "model_config": str(model_config),
                       "device": "cpu", "workers": 0, "batch_size": 8}  # fmt: skip
    config["evaluation_sets"] = [{"name": "val", "path": str(tmp_path / "eval")}]
    run_workflow(tmp_path, config)
    work = tmp_path / "work" / "demo"
    with np.load(work / "references" / "embed.npz") as z:
        refs = dict(zip(z["key"], z["image"].astype(np.float32), strict=True))
    assert sorted(refs) == [f"val/crop_{i}.jpg" for i in range(3)]
    emb = {}
    for f in sorted((work / "embed").glob("*.npz")):
        with np.load(f) as z:
            emb.update(zip(z["key"], z["image"].astype(np.float32), strict=True))
    best = {k: max(refs, key=lambda r: float(v @ refs[r])) for k, v in emb.items()}
    near = {k: r for k, r in best.items() if float(emb[k] @ refs[r]) >= threshold - 2e-3}
    _, rejected, stats = published(tmp_path)
    left = rejected[rejected["reason"] == "near_reference"]
    assert 0 < len(near) < len(emb) and set(left["key"]) == set(near)
    for key, detail in zip(left["key"], left["detail"], strict=True):
        m = re.fullmatch(r"near reference image (\S+) \(evaluation set val\): CLIP image cosine similarity ([\d.]+)",
                         detail)  # fmt: skip
        assert m and float(m[2]) == pytest.approx(float(emb[key] @ refs[m[1]]), abs=2e-3) and float(m[2]) >= threshold
    assert stats["input_records"] == stats["published"] + stats["rejected"] == 6
