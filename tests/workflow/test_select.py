"""Selection over the whole dataset and score heads inside the real workflow (the generated demo, a tiny random
CLIP model and random heads of LAION's layouts): the count kept is the fraction asked, the ledger names each rule
with the score it saw, the card and build.json state the selection, the heads' scores are published and
described, another part size selects the same samples, a takedown list and an evaluation set leave their records
out, and a rebuild elsewhere with all of these (and near-duplicates keeping the best caption) is byte-identical."""

import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # inherited by snakemake and its jobs: nothing is downloaded

import pandas as pd
import pytest
import yaml
from PIL import Image
from workflow_helpers import demo_config, run_workflow, sha256

from shardsmith.cli.demo import make_demo
from shardsmith.cli.tinyclip import NAME, write_tiny_clip
from shardsmith.embed.select import kept_count
from shardsmith.embed.stats import score_columns
from tests.workflow.test_cluster import file_hashes

pytestmark = pytest.mark.workflow
COLUMNS = score_columns(NAME)
# The demo's 25 manifest rows in one part, then in two (its 8 photos and 2 legacy shards are a part each either
# way): 4 parts, then 5. Each part is an embed_part job, most of a build's time.
PART_SIZES = (32, 16)
SELECT = [
    {"name": "clip_top", "column": "similarity", "top_fraction": 0.6},
    {"name": "image_norm", "column": "image_norm", "top_fraction": 0.9},
    {"name": "aesthetic_top", "column": "aesthetic", "top_fraction": 0.9},  # a score head's, by its name
]


def heads(models_dir) -> list[dict]:
    """Random heads of LAION's aesthetic and NSFW layouts at the tiny model's embedding size, written once (a
    newer file is an input changed: its parts are embedded again)."""
    from shardsmith.embed.heads import write_random_head  # torch: only where a test embeds

    for i, kind in enumerate(("aesthetic", "nsfw")):
        if not (models_dir / f"{kind}.pth").exists():
            write_random_head(models_dir / f"{kind}.pth", kind, 32, seed=i)
    return [{"name": k, "kind": k, "weights": str(models_dir / f"{k}.pth")} for k in ("aesthetic", "nsfw")]


def build(base, data, models, part_size, name=None, report=True, **embed_settings):
    """A build published to root/fast-storage; with report=False it stops at the publish, without the report's
    plots and tables (built by the first build: plot_embeddings marks the selection's cuts)."""
    model_config, ckpt = models
    embed = {
        "enabled": True, "model": NAME, "pretrained": str(ckpt), "model_config": str(model_config),
        "batch_size": 16, "workers": 1, "heads": heads(model_config.parent), **embed_settings,
    }  # fmt: skip
    root = base / (name or f"build-{part_size}")
    config = demo_config(data, root, embed=embed, select=SELECT, part_size=part_size)
    # every curation option at once: a takedown list, an evaluation set, near-duplicates left out keeping the
    # best caption (a rebuild of all of them is byte-identical: the last test)
    config["filters"] = [
        {"name": "takedowns", "column": "url", "op": "not_in_file", "value": str(data / "takedowns.txt")}
    ]
    config["evaluation_sets"] = [{"name": "val", "path": str(data / "eval")}]
    config["dedupe"] = {"near": "exclude", "keep": "best_caption"}
    run_workflow(root, config, *([] if report else [str(root / "work" / "demo" / "published" / "v1.json")]))
    latest = root / "fast-storage" / "demo"
    return root, latest / (latest / "latest").read_text().strip()


def curation_inputs(data: Path) -> None:
    """A takedown list of two of the demo manifest's URLs (one listed twice, and one no record has) and an
    evaluation set of recompressed copies of three other manifest images."""
    urls = [line.split("\t")[1].strip() for line in (data / "manifest.tsv").read_text().splitlines()]
    (data / "takedowns.txt").write_text(f"{urls[1]}\n{urls[3]}\n{urls[3]}\nhttps://gone.example/x.jpg\n")
    (data / "eval").mkdir()
    for url in urls[5:8]:
        with Image.open(url) as im:
            im.convert("RGB").save(data / "eval" / Path(url).name, quality=60)


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    base = tmp_path_factory.mktemp("select")
    make_demo(base / "data")
    curation_inputs(base / "data")
    models = write_tiny_clip(base / "models")
    return [build(base, base / "data", models, size, report=i == 0) for i, size in enumerate(PART_SIZES)]


def scores_of(root) -> pd.DataFrame:
    parts = sorted((root / "work" / "demo" / "embed").glob("*.parquet"))
    return pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)


def test_the_fraction_asked_is_kept_and_the_ledger_names_each_rule_with_its_score(builds):
    root, version = builds[0]
    scores = scores_of(root)
    selection = json.loads((root / "work" / "demo" / "select" / "selection.json").read_text())
    top = selection["rules"]["clip_top"]
    assert top["scored"] == len(scores) and top["kept"] == kept_count(0.6, len(scores))
    rejected = pd.read_parquet(version / "rejected.parquet")
    select = rejected[rejected["stage"] == "select"]
    by_rule = select.groupby("reason")["key"].apply(set)
    sim = scores.set_index("key")[COLUMNS["similarity"]]
    first = by_rule["clip_top"]  # every sample the first rule leaves out is named by it
    assert len(first) == top["scored"] - top["kept"] > 0
    assert sim.drop(list(first)).min() >= top["threshold"] > sim[list(first)].max() - 1e-4
    details = select.loc[select["reason"] == "clip_top", "detail"]
    assert all(d.startswith(f"{COLUMNS['similarity']} ") and "kept: the top 0.6" in d for d in details)
    assert not (by_rule.get("image_norm", set()) & first)
    stats = json.loads((version / "stats.json").read_text())
    assert stats["published"] + stats["rejected"] == stats["input_records"]
    published = set(pd.read_parquet(version / "manifest.parquet", columns=["key"])["key"])
    assert not published & set(select["key"])
    counts = json.loads((version / "embedding_stats.json").read_text())["counts"]
    assert counts["excluded_by_selection"] == len(select)  # the ledger's select rows, each sample once
    others = counts["excluded_low_similarity"] + counts["excluded_by_selection"] + counts["not_published_other"]
    assert counts["embedded"] == counts["published"] + others


def test_the_card_and_build_json_state_the_selection(builds):
    _, version = builds[0]
    build_json = json.loads((version / "build.json").read_text())
    assert set(build_json["selection"]) == {"clip_top", "image_norm", "aesthetic_top"}
    top = build_json["selection"]["clip_top"]
    assert top["top_fraction"] == 0.6 and top["model"] == NAME and top["column"] == COLUMNS["similarity"]
    assert abs(top["fraction_kept"] - 0.6) < 1 / top["scored"]
    card = (version / "README.md").read_text()
    assert "## Selection" in card and "`select/clip_top`" in card and "top 0.6" in card


def test_another_part_size_selects_the_same_samples(builds):
    (root_a, version_a), (root_b, version_b) = builds
    kept = [set(pd.read_parquet(v / "manifest.parquet", columns=["key"])["key"]) for v in (version_a, version_b)]
    assert kept[0] == kept[1]
    assert len(list((root_b / "work" / "demo" / "plan" / "parts").glob("*.parquet"))) > len(
        list((root_a / "work" / "demo" / "plan" / "parts").glob("*.parquet"))
    )
    selections = [json.loads((r / "work" / "demo" / "select" / "selection.json").read_text()) for r in (root_a, root_b)]
    assert selections[0]["summary"] == selections[1]["summary"]


def test_with_min_similarity_too_each_sample_left_out_is_in_the_ledger_once_and_the_counts_add_up(builds):
    """The first build again with embed.min_similarity: nothing is embedded again; a sample below it is named by
    it (its exclusion comes first), the selection still counts it in its pool, and embedding_stats adds up."""
    root, _ = builds[0]
    scores = scores_of(root)
    threshold = float(scores[COLUMNS["similarity"]].quantile(0.2))
    embedded = {p: p.stat().st_mtime_ns for p in (root / "work" / "demo" / "embed").glob("*.parquet")}
    config = yaml.safe_load((root / "config.yaml").read_text())
    config["embed"]["min_similarity"] = threshold
    config["version"] = "v2"  # v1 is published: another selection is another version
    run_workflow(root, config)
    assert {p: p.stat().st_mtime_ns for p in embedded} == embedded
    latest = root / "fast-storage" / "demo"
    version = latest / (latest / "latest").read_text().strip()
    rejected = pd.read_parquet(version / "rejected.parquet")
    low = set(scores.loc[scores[COLUMNS["similarity"]] < threshold, "key"])
    assert set(rejected.loc[rejected["reason"] == "low_similarity", "key"]) == low and low
    assert not rejected["key"].duplicated().any()
    selection = json.loads((root / "work" / "demo" / "select" / "selection.json").read_text())["rules"]["clip_top"]
    assert selection["scored"] == len(scores)  # the pool is every scored sample, those below min_similarity too
    counts = json.loads((version / "embedding_stats.json").read_text())["counts"]
    assert counts["excluded_low_similarity"] == len(low)
    assert counts["excluded_by_selection"] == int((rejected["stage"] == "select").sum())
    others = counts["excluded_low_similarity"] + counts["excluded_by_selection"] + counts["not_published_other"]
    assert counts["embedded"] == counts["published"] + others


def test_the_heads_scores_are_published_in_the_score_tables_and_the_manifest_described_and_shown(builds):
    root, version = builds[0]
    scores = scores_of(root)
    published = pd.concat(pd.read_parquet(p) for p in sorted(version.glob("*.scores.parquet")))
    assert {"aesthetic_score", "nsfw_score"} <= set(published.columns)
    manifest = pd.read_parquet(version / "manifest.parquet").set_index("key")
    assert set(published["key"]) == set(manifest.index)
    score_columns_ = [c for c in published.columns if c != "key"]  # the similarity, norms and heads' scores
    assert list(manifest.columns[-len(score_columns_) :]) == score_columns_
    pd.testing.assert_frame_equal(manifest.loc[published["key"], score_columns_], published.set_index("key"),
                                  check_dtype=False)  # fmt: skip
    by_key = scores.set_index("key")
    assert (published.set_index("key")["nsfw_score"] == by_key.loc[published["key"], "nsfw_score"]).all()
    stats = json.loads((version / "embedding_stats.json").read_text())
    assert stats["heads"]["aesthetic"]["n"] == len(published) == sum(stats["heads"]["nsfw"]["histogram"]["counts"])
    assert stats["heads"]["nsfw"]["mean"] == pytest.approx(published["nsfw_score"].mean(), rel=1e-6)
    prov = {h["name"]: h for h in stats["provenance"]["heads"]}
    assert prov["aesthetic"]["weights_sha256"] == sha256(Path(prov["aesthetic"]["weights"]))
    card = (version / "README.md").read_text()
    assert "| `aesthetic` | aesthetic | `aesthetic_score` | `aesthetic.pth` |" in card
    aesthetic = json.loads((root / "work" / "demo" / "select" / "selection.json").read_text())["rules"]["aesthetic_top"]
    assert aesthetic["column"] == "aesthetic_score" and aesthetic["scored"] == len(scores)


def test_the_takedown_list_and_the_evaluation_set_leave_their_records_out(builds):
    root, version = builds[0]
    data = root.parent / "data"
    rejected = pd.read_parquet(version / "rejected.parquet")
    taken_down = rejected[rejected["reason"] == "takedowns"]
    assert sorted(taken_down["url"]) == sorted((data / "takedowns.txt").read_text().splitlines()[:2])
    lists = json.loads((root / "work" / "demo" / "plan" / "parts" / "id_lists.json").read_text())
    assert "https://gone.example/x.jpg" in json.dumps(lists)
    evaluation = {p.name for p in (data / "eval").iterdir()}
    manifest = pd.read_parquet(version / "manifest.parquet", columns=["url"])
    assert not {Path(u).name for u in manifest["url"]} & evaluation  # none published, whichever step left it out
    near = rejected[rejected["reason"] == "near_reference"]
    assert len(near) and all(d.startswith("near reference image val/") for d in near["detail"])
    stats = json.loads((version / "stats.json").read_text())
    assert stats["published"] + stats["rejected"] == stats["input_records"] == len(manifest) + len(rejected)


def test_a_rebuild_elsewhere_with_every_curation_option_is_byte_identical(builds, tmp_path):
    root, version = builds[0]
    models = (root.parent / "models" / f"{NAME}.json", root.parent / "models" / f"{NAME}.pt")
    _, again = build(tmp_path, root.parent / "data", models, PART_SIZES[0], name="again", report=False)
    assert file_hashes(again) == file_hashes(version)  # every file, the publish marker but its time
