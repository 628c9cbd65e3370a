"""Curation inside the real workflow: a LAION-style manifest (punsafe, pwatermark, similarity, face_bboxes)
served on 127.0.0.1 through every filter, caption rule, image rule and the face blur, the ledger adding up and
a rebuild in another folder byte-identical; and docs/curation.md's recipes run as written."""

import io
import json
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from generated import jpeg_bytes
from httpserver import Reply
from PIL import Image
from workflow_helpers import REPO, run_workflow

from shardsmith.cli.tinyclip import CONFIG, write_tiny_clip
from shardsmith.cli.tinyclip import NAME as TINY
from tests.workflow.test_download import FAST, web_config
from tests.workflow.test_repro import files

pytestmark = pytest.mark.workflow
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # inherited by snakemake and its jobs: nothing is downloaded


def photo(size=(160, 120), seed=0) -> bytes:
    """A textured JPEG (blurring changes it visibly)."""
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


EN = "a red bicycle leaning against a brick wall"
# (caption, punsafe, pwatermark, similarity, face_bboxes, image, where it ends)
LAION_ROWS = [
    (EN, 0.1, 0.1, 0.35, [[0.2, 0.2, 0.5, 0.6]], "photo", "published, blurred"),
    (EN, 0.9, 0.1, 0.35, [], "photo", "filter/unsafe"),
    (EN, 0.1, 0.95, 0.35, [], "photo", "filter/watermark"),
    (EN, 0.1, 0.1, 0.20, [], "photo", "filter/clip_similarity"),
    (EN, None, 0.1, 0.35, [], "photo", "filter/unsafe"),
    ("ein rotes Fahrrad lehnt an einer Mauer aus Backstein", 0.1, 0.1, 0.35, [], "photo", "caption/language"),
    ("bicycle", 0.1, 0.1, 0.35, [], "photo", "caption/too_few_words"),
    (EN, 0.1, 0.1, 0.35, [], "wide", "resize/aspect_ratio"),
    (EN, 0.1, 0.1, 0.35, [[0.5, 0.1, 1.5, 0.4]], "photo", "resize/bad_boxes"),
    ("a green tree standing alone in a wide field", 0.2, 0.3, 0.4, [], "small", "published, passed through"),
    (EN, 0.1, 0.1, 0.35, [], "gone", "download/not_found"),
    ("two people walking a dog on the beach", 0.1, 0.1, 0.31, [], "photo", "published"),
    ("a yellow kite flying high over green hills", 0.1, 0.1, 0.4, [], "photo", "filter/takedowns"),
]
LAION_CURATION = {
    "filters": [
        {"name": "unsafe", "column": "punsafe", "op": "<", "value": 0.5},
        {"name": "watermark", "column": "pwatermark", "op": "<", "value": 0.8},
        {"name": "clip_similarity", "column": "similarity", "op": ">=", "value": 0.28},
    ],
    "captions": {"languages": ["en"], "min_words": 2},
    "resize": {"max_aspect_ratio": 3, "max_side": 256},
}


def serve(http_server, rows) -> tuple[list[dict], dict[int, bytes]]:
    images = {"photo": None, "wide": jpeg_bytes((400, 100)), "small": jpeg_bytes((64, 48), (20, 120, 40))}
    out, served = [], {}
    for i, (caption, punsafe, pwatermark, similarity, boxes, kind, _) in enumerate(rows):
        body = photo(seed=i) if kind == "photo" else images.get(kind)
        url = http_server.route(f"/{i}.jpg", Reply(body=body)) if body else http_server.url(f"/{i}.jpg")
        served[i] = body
        out.append(
            {
                "url": url,
                "caption": caption,
                "punsafe": punsafe,
                "pwatermark": pwatermark,
                "similarity": similarity,
                "face_bboxes": json.dumps(boxes),
            }
        )
    return out, served


def shard_samples(output) -> dict[str, dict[str, bytes]]:
    import tarfile

    samples: dict[str, dict[str, bytes]] = {}
    for tar_path in sorted(output.glob("*.tar")):
        with tarfile.open(tar_path) as tar:
            for m in tar:
                key, ext = m.name.split(".", 1)
                samples.setdefault(key, {})[ext] = tar.extractfile(m).read()
    return samples


def test_a_laion_style_manifest_through_every_filter_adds_up_and_rebuilds_byte_identical(tmp_path, http_server):
    manifest, served = serve(http_server, LAION_ROWS)
    data = tmp_path / "data"
    data.mkdir()
    pd.DataFrame(manifest).to_parquet(data / "laion.parquet", index=False)
    source = {"name": "laion", "type": "manifest", "path": str(data / "laion.parquet"), "blur_boxes": "face_bboxes"}
    takedowns = [m["url"] for m, (*_, end) in zip(manifest, LAION_ROWS) if end == "filter/takedowns"]
    (data / "takedowns.txt").write_text("\n".join([*takedowns, "http://127.0.0.1:9/never-listed.jpg"]) + "\n")
    curation = {**LAION_CURATION, "filters": [*LAION_CURATION["filters"], {
        "name": "takedowns", "column": "url", "op": "not_in_file", "value": str(data / "takedowns.txt")}]}  # fmt: skip
    roots = [tmp_path / "a", tmp_path / "b"]
    for root in roots:
        config = web_config(root, [source], download=FAST, samples_per_shard=2, **curation)
        run_workflow(root, config, "all", str(root / "output" / "web" / "build.json"))
    out = roots[0] / "output" / "web"
    stats = json.loads((out / "stats.json").read_text())
    expected = [end for *_, end in LAION_ROWS]
    published = [i for i, end in enumerate(expected) if end.startswith("published")]
    assert (stats["input_records"], stats["published"]) == (len(LAION_ROWS), len(published))
    assert stats["rejected"] == len(LAION_ROWS) - len(published)
    reasons = {e: expected.count(e) for e in expected if not e.startswith("published")}
    assert stats["rejected_by_reason"] == reasons
    assert stats["blurred_images"] == 1

    # filtered records were never requested; the others were, once a build
    for i, end in enumerate(expected):
        assert http_server.count(f"/{i}.jpg") == (0 if end.startswith("filter/") else 2), (i, end)
    ledger = pd.read_parquet(out / "rejected.parquet")
    by_reason = {f"{r.stage}/{r.reason}": r.detail for r in ledger.itertuples()}
    assert by_reason["filter/watermark"] == "pwatermark is 0.95; kept: pwatermark < 0.8"
    assert by_reason["filter/clip_similarity"] == "similarity is 0.2; kept: similarity >= 0.28"
    assert re.fullmatch(r"de \(0\.\d\d\), not in languages \[en\]", by_reason["caption/language"])
    assert "box 0" in by_reason["resize/bad_boxes"]
    assert by_reason["filter/takedowns"] == f"url is {takedowns[0]}; kept: url not_in_file {data / 'takedowns.txt'}"
    id_lists = json.loads((roots[0] / "work" / "web" / "plan" / "parts" / "id_lists.json").read_text())
    assert id_lists["takedowns"]["unknown_examples"] == ["http://127.0.0.1:9/never-listed.jpg"]

    manifest_table = pd.read_parquet(out / "manifest.parquet")
    assert list(manifest_table["language"]) == ["en"] * len(published)
    assert (manifest_table["language_score"] > 0.5).all() and list(manifest_table["blurred"]) == [1, 0, 0]
    samples = shard_samples(out)
    by_url = {json.loads(s["json"])["url"]: s for s in samples.values()}
    blurred, small = by_url[manifest[0]["url"]], by_url[manifest[9]["url"]]
    assert small["jpg"] == served[9]  # no boxes: passed through byte for byte
    meta = json.loads(blurred["json"])
    assert meta["blur"] == {"boxes": [[0.2, 0.2, 0.5, 0.6]], "grow": 0.1, "sigma": 0.1}
    assert (meta["language"], meta["fields"]["punsafe"]) == ("en", 0.1)
    before = np.asarray(Image.open(io.BytesIO(served[0])).convert("RGB"), dtype=float)
    after = np.asarray(Image.open(io.BytesIO(blurred["jpg"])), dtype=float)
    assert after.shape == before.shape
    face = (slice(int(0.25 * 120), int(0.55 * 120)), slice(int(0.25 * 160), int(0.45 * 160)))
    assert np.abs(after[face] - before[face]).mean() > 30  # noise blurred towards grey
    card = (out / "README.md").read_text()
    assert "| filter/unsafe | `punsafe < 0.5` (every manifest source) | 2 |" in card
    n = len(takedowns) + 1
    assert f"(every manifest source; {n:,} ids, {len(takedowns):,} match a record) | {len(takedowns)} |" in card
    assert "Faces blurred from the boxes of `laion` in 1 published images" in card
    build = json.loads((out / "build.json").read_text())
    assert build["config"]["blur"] == {"grow": 0.1, "sigma": 0.1} and build["language_model"]["sha256"]

    assert files(out) == files(roots[1] / "output" / "web")  # the rebuild elsewhere: every file byte-identical


def recipes() -> list[dict]:
    """The YAML blocks of docs/curation.md's Recipes section, as written."""
    text = (REPO / "docs" / "curation.md").read_text().split("## Recipes", 1)[1]
    return [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", text, re.S)]


def test_docs_curation_has_the_seven_recipes():
    names = [r["sources"][0]["name"] for r in recipes()]
    assert names == [
        "laion", "datacomp", "datacomp_clip", "datacomp_metadata", "aesthetics", "aesthetics_scored", "datacomp_subset"
    ]  # fmt: skip


def random_aesthetic_head(path) -> str:
    """LAION's aesthetic MLP at the tiny model's embedding size, randomly initialised, its last layer scaled so
    that its scores on the test's photos spread around the recipe's cut of 6 (unscaled, they differ by 0.005)."""
    import torch  # here: collecting the workflow tests imports no torch

    from shardsmith.embed.heads import write_random_head

    write_random_head(path, "aesthetic", CONFIG["embed_dim"], seed=5)
    state = torch.load(path, weights_only=True)
    state["layers.7.weight"] *= 1000
    state["layers.7.bias"] = torch.tensor([1.5])
    torch.save(state, path)
    return str(path)


@pytest.mark.parametrize("recipe", recipes(), ids=lambda r: r["sources"][0]["name"])
def test_each_curation_recipe_runs_as_written(recipe, tmp_path, http_server):
    """On a manifest with the columns LAION-5B, DataComp and LAION-Aesthetics metadata carry: only the source's
    path is changed, and a CLIP model's weights are a tiny random model's of the same shape (nothing is fetched).
    Each recipe leaves out what its rules say, and the ledger adds up."""
    rows = [
        # (caption, similarity, punsafe, pwatermark, aesthetic, (width, height), boxes)
        ("a red bicycle leaning against a brick wall", 0.35, 0.1, 0.1, 6.5, (640, 480), [[0.1, 0.1, 0.3, 0.3]]),
        ("a red bicycle leaning against a brick wall", 0.20, 0.1, 0.1, 6.5, (640, 480), []),
        ("ein rotes Fahrrad lehnt an einer Mauer aus Backstein", 0.35, 0.1, 0.1, 6.5, (640, 480), []),
        ("a bicycle", 0.35, 0.1, 0.1, 6.5, (640, 480), []),
        ("a red bicycle leaning against a brick wall", 0.35, 0.1, 0.9, 5.0, (150, 480), []),
        ("two people walking a dog on the beach", 0.30, 0.9, 0.1, 7.0, (640, 480), []),
    ]
    manifest = []
    for i, (caption, sim, unsafe, mark, aesthetic, (w, h), boxes) in enumerate(rows):
        url = http_server.route(f"/{i}.jpg", Reply(body=photo((w // 2, h // 2), seed=i)))
        manifest.append(
            {"URL": url, "TEXT": caption, "url": url, "text": caption, "uid": f"{i:032x}", "similarity": sim,
             "punsafe": unsafe, "pwatermark": mark, "aesthetic": aesthetic, "original_width": w,
             "clip_l14_similarity_score": sim,
             "original_height": h, "face_bboxes": boxes}
        )  # fmt: skip
    pd.DataFrame(manifest).to_parquet(tmp_path / "metadata.parquet", index=False)
    recipe["sources"][0]["path"] = str(tmp_path / "metadata.parquet")
    for f in recipe.get("filters", []):  # an id list: rows 0, 2 and 3 of the manifest, and one uid it lacks
        if f["op"].endswith("_file"):
            f["value"] = str(tmp_path / Path(f["value"]).name)
            Path(f["value"]).write_text("".join(f"{i:032x}\n" for i in (0, 2, 3, 99)))
    if "embed" in recipe:
        model_config, ckpt = write_tiny_clip(tmp_path / "models")
        tiny = {"model": TINY, "pretrained": str(ckpt), "model_config": str(model_config), "workers": 1}
        recipe["embed"] = {**recipe["embed"], **tiny}
        for head in recipe["embed"].get("heads", []):
            head["weights"] = random_aesthetic_head(tmp_path / "models" / Path(head["weights"]).name)
    root = tmp_path / "run"
    config = web_config(root, recipe["sources"], download=FAST, samples_per_shard=2)
    config.update({k: v for k, v in recipe.items() if k != "sources"})
    run_workflow(root, config, str(root / "output" / "web" / "stats.json"))
    stats = json.loads((root / "output" / "web" / "stats.json").read_text())
    assert stats["input_records"] == len(rows) == stats["published"] + stats["rejected"]
    expected = {
        "laion": {"filter/clip_similarity": 1, "caption/language": 1},
        "datacomp": {"filter/short_width": 1, "caption/language": 1, "caption/too_few_words": 1},
        "datacomp_clip": {"select/clip_score_top30": 4},  # 2 of the 6 scored kept: round(0.3 x 6)
        "datacomp_metadata": {"select/clip_score_top30": 4},  # of the four tied at 0.35, the earliest two kept
        "aesthetics": {"filter/aesthetic": 1, "filter/unsafe": 1},
        "aesthetics_scored": {"filter/watermark": 1, "filter/unsafe": 1, "select/aesthetic_6": None},
        "datacomp_subset": {"filter/subset": 3},
    }[recipe["sources"][0]["name"]]
    if "select/aesthetic_6" in expected:  # the samples the random head scores below 6, from the part score tables
        scored = pd.concat(pd.read_parquet(p) for p in sorted(root.glob("**/embed/*.parquet")))
        assert len(scored) == 4 and "aesthetic_score" in scored
        expected["select/aesthetic_6"] = int((scored["aesthetic_score"] < 6).sum())
        assert 0 < expected["select/aesthetic_6"] < 4  # the cut falls between the samples
        published = pd.read_parquet(root / "output" / "web" / "manifest.parquet", columns=["key"])["key"]
        kept = scored.set_index("key").loc[published, "aesthetic_score"]
        assert (kept >= 6).all() and len(kept) == 4 - expected["select/aesthetic_6"]
    assert stats["rejected_by_reason"] == expected
    if recipe["sources"][0]["name"] == "datacomp_metadata":
        kept = pd.read_parquet(root / "output" / "web" / "manifest.parquet", columns=["source_id"])["source_id"]
        assert sorted(int(s.rsplit(":", 1)[1]) for s in kept) == [1, 3]  # manifest rows 0 and 2, counted from 1
    if "filter/subset" in expected:
        report = json.loads((root / "work" / "web" / "plan" / "parts" / "id_lists.json").read_text())["subset"]
        assert report["matched"] == 3 and report["unknown_examples"] == [f"{99:032x}"]
