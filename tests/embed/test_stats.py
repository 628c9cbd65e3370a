"""Embedding stats (shardsmith.embed.stats): DataComp-style score columns, per-shard score tables and sums that
aggregate exactly, low-similarity exclusions to the ledger, and no torch in the summary jobs."""

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from workflow_helpers import REPO

from shardsmith.core.errors import ConfigError
from shardsmith.embed import stats as embed_stats
from shardsmith.embed.stats import HIST_EDGES, QUANTILES, check_heads, score_columns
from tests.embed.test_part import COLS, NAME, SIM
from tests.shards.reference import plan_in_process


def test_score_heads_are_checked_with_the_config_not_after_the_downloads(tmp_path):
    (tmp_path / "a.pth").write_bytes(b"weights")
    head = {"name": "aesthetic", "kind": "aesthetic", "weights": str(tmp_path / "a.pth")}
    check_heads({"embed": {"enabled": True, "heads": [head]}})
    check_heads({"embed": {"enabled": False, "heads": []}})
    cases = [
        ({"enabled": False, "heads": [head]}, "embed.heads aesthetic: a score head scores the image embeddings"),
        ({"enabled": True, "heads": [head, head]}, "head names must differ"),
        ({"enabled": True, "heads": [{**head, "weights": str(tmp_path / "b.pth")}]}, r"no such file .*b\.pth"),
    ]
    for embed, message in cases:
        with pytest.raises(ConfigError, match=message):
            check_heads({"embed": embed})
    for name in ("similarity", "clip_b32_similarity"):  # `select: column: similarity` would read the head's
        with pytest.raises(ConfigError, match=rf"embed.heads {name}: ViT-B-32's own scores are named so"):
            check_heads({"embed": {"enabled": True, "model": "ViT-B-32", "heads": [{**head, "name": name}]}})
    check_heads({"embed": {"enabled": True, "model": "ViT-B-32", "heads": [head]}})


def test_score_columns_are_named_as_datacomp_does():
    assert score_columns("ViT-B-32")["similarity"] == "clip_b32_similarity_score"
    assert score_columns("ViT-L-14")["similarity"] == "clip_l14_similarity_score"
    assert score_columns("ViT-B-16-quickgelu")["image_norm"] == "clip_b16_quickgelu_image_norm"
    assert score_columns("hf-hub:timm/ViT-SO400M-14-SigLIP")["similarity"] == "clip_so400m_14_siglip_similarity_score"
    assert score_columns("tiny-clip") == {
        "similarity": "tiny_clip_similarity_score",
        "image_norm": "tiny_clip_image_norm",
        "text_norm": "tiny_clip_text_norm",
    }


def _plan_and_score(parts, tmp_path, exclusions=(), samples_per_shard=5):
    """The planning jobs over the parts (as the workflow runs them), then the per-shard score tables and sums."""
    names = [p for p in parts]
    plan_dir = tmp_path / "plan"
    shards = plan_in_process(
        [parts[p]["samples"] for p in names], names, "ds", samples_per_shard, plan_dir, exclusions=list(exclusions)
    )
    scores = [parts[p]["out_scores"] for p in names]
    embs = [parts[p]["out_embeddings"] for p in names]
    made = []
    for s in shards:
        out, sums = tmp_path / f"{s}.scores.parquet", tmp_path / f"{s}.sums.json"
        embed_stats.write_shard_scores(str(plan_dir / f"{s}.samples.parquet"), scores, embs, str(out), str(sums))
        npz = tmp_path / f"{s}.embeddings.npz"
        embed_stats.write_shard_embeddings(str(plan_dir / f"{s}.samples.parquet"), embs, str(npz))
        made.append((s, out, sums, npz))
    return plan_dir, made


def test_stats_aggregate_exactly_across_parts_and_shards(parts, tmp_path):
    plan_dir, shards = _plan_and_score(parts, tmp_path)
    for name, scores, _, npz in shards:  # each shard's table follows its plan, rows aligned with its embeddings
        plan = pd.read_parquet(plan_dir / f"{name}.samples.parquet")
        table = pd.read_parquet(scores)
        assert list(table["key"]) == list(plan["key"]) == list(np.load(npz)["key"])
    stats = embed_stats.summarize(
        [str(s[1]) for s in shards], [str(s[2]) for s in shards], [p["out_info"] for p in parts.values()], NAME,
        shard_embeddings_paths=[str(s[3]) for s in shards],
    )  # fmt: skip
    everything = pd.concat([pd.read_parquet(p["out_scores"]) for p in parts.values()])
    sim = everything[SIM].to_numpy(np.float64)
    assert stats["counts"] == {
        "embedded": 21,
        "published": 21,
        "excluded_low_similarity": 0,
        "not_published_other": 0,
        "parts": 3,
        "shards": 5,
    }
    assert stats["similarity"]["mean"] == pytest.approx(sim.mean()) and stats["similarity"]["std"] == pytest.approx(
        sim.std()
    )
    assert list(stats["similarity"]["quantiles"].values()) == pytest.approx(list(np.quantile(sim, QUANTILES)))
    assert stats["similarity"]["histogram"]["counts"] == np.histogram(sim, bins=HIST_EDGES)[0].tolist()
    assert sum(stats["similarity"]["histogram"]["counts"]) == 21
    norms = everything[COLS["text_norm"]].to_numpy(np.float64)
    assert stats["text_norm"]["max"] == pytest.approx(norms.max()) and stats["text_norm"]["mean"] == pytest.approx(
        norms.mean()
    )
    image = np.concatenate([np.load(p["out_embeddings"])["image"].astype(np.float64) for p in parts.values()])
    assert stats["mean_image_embedding"] == pytest.approx(image.mean(axis=0).tolist(), abs=1e-6)
    assert stats["random_weights"] is True and stats["provenance"]["mixed"] == []


def test_min_similarity_sends_samples_to_the_ledger_and_shards_stay_uniform(parts, tmp_path):
    part_scores = [p["out_scores"] for p in parts.values()]
    everything = pd.concat([pd.read_parquet(p) for p in part_scores], ignore_index=True)
    threshold = float(np.median(everything[SIM]))
    # one table a group of parts, as exclude_low_similarity writes them: the first part, then the others
    excluded = [str(tmp_path / "excluded-0.parquet"), str(tmp_path / "excluded-1.parquet")]
    n = sum(
        embed_stats.exclude_low_similarity(s, NAME, threshold, t)
        for s, t in zip([part_scores[:1], part_scores[1:]], excluded, strict=True)
    )
    low = set(everything.loc[everything[SIM] < threshold, "key"])
    assert n == len(low) > 0
    plan_dir, shards = _plan_and_score(parts, tmp_path, exclusions=excluded, samples_per_shard=4)
    dropped = pd.read_parquet(plan_dir / "dropped.parquet")
    assert (
        set(dropped["key"]) == low
        and set(dropped["stage"]) == {"embed"}
        and set(dropped["reason"]) == {"low_similarity"}
    )
    assert all(d.startswith(f"{SIM} ") and f"< min_similarity {threshold}" in d for d in dropped["detail"])
    sizes = [len(pd.read_parquet(s[1])) for s in shards]
    assert all(s == 4 for s in sizes[:-1]) and 0 < sizes[-1] <= 4 and sum(sizes) == len(everything) - len(low)
    stats = embed_stats.summarize(
        [str(s[1]) for s in shards], [str(s[2]) for s in shards], [p["out_info"] for p in parts.values()], NAME,
        exclusions=excluded, min_similarity=threshold,
    )  # fmt: skip
    assert stats["counts"]["excluded_low_similarity"] == len(low) and stats["similarity"]["min"] >= threshold
    assert stats["counts"]["published"] + len(low) == stats["counts"]["embedded"]
    assert len(embed_stats.low_similarity_exclusions(part_scores, NAME, None)) == 0


def test_summary_and_exclusion_modules_do_not_import_torch():
    code = "import sys, shardsmith.embed.stats; assert 'torch' not in sys.modules, 'torch imported'"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_exclusions_are_written_a_part_at_a_time_and_parts_with_none_below_add_nothing(parts, tmp_path):
    part_scores = [p["out_scores"] for p in parts.values()]
    lowest = min(float(pd.read_parquet(p)[SIM].min()) for p in part_scores)
    out = tmp_path / "none.parquet"
    assert embed_stats.exclude_low_similarity(part_scores, NAME, lowest, str(out)) == 0  # nothing strictly below
    assert list(pd.read_parquet(out).columns) == ["key", "stage", "reason", "detail"]
    first = pd.read_parquet(part_scores[0])
    threshold = float(first[SIM].max()) + 1e-6  # every sample of the first part, maybe some of the others
    n = embed_stats.exclude_low_similarity(part_scores, NAME, threshold, str(out))
    got = pd.read_parquet(out)
    assert n == len(got) >= len(first) and list(got["key"][: len(first)]) == list(first["key"])  # in part order


def test_parts_scored_by_other_heads_cannot_be_pooled_and_each_heads_scores_are_described():
    from shardsmith.embed.stats import head_stats, merge_provenance

    head = {"name": "aesthetic", "kind": "aesthetic", "column": "aesthetic_score", "weights_sha256": "a" * 64}
    infos = [{"part": f"p{i}", "provenance": {"model": "m", "heads": [head]}} for i in range(2)]
    assert merge_provenance(infos)["heads"] == [head]
    infos[1]["provenance"]["heads"] = [{**head, "weights_sha256": "b" * 64}]
    with pytest.raises(ValueError, match="different heads"):
        merge_provenance(infos)
    scores = pd.DataFrame({"aesthetic_score": [4.0, 5.0, 6.0, np.nan]})
    described = head_stats(scores, [head])["aesthetic"]
    assert described["n"] == 3 and described["mean"] == 5.0 and described["min"] == 4.0
    assert sum(described["histogram"]["counts"]) == 3 and described["histogram"]["edges"][0] == 4.0
