"""Report numbers and tables (shardsmith.report.numbers) on small generated tables, without Snakemake."""

import pandas as pd
import pytest

from shardsmith.report import numbers as report

STATS = {
    "dataset": "ds",
    "input_records": 100,
    "published": 80,
    "rejected": 20,
    "shards": 3,
    "bytes": 123456,
    "rejected_by_stage": {"shard": 1, "resize": 7, "download": 10, "embed": 2},
    "rejected_by_reason": {
        "download/not_found": 10,
        "resize/too_small": 7,
        "embed/low_similarity": 2,
        "shard/duplicate_key": 1,
    },
    "published_by_source": {"a": 50, "b": 30},
}


def rejected_table(n_by_reason: dict[str, int]) -> pd.DataFrame:
    rows = []
    for reason, n in n_by_reason.items():
        stage, code = reason.split("/")
        for i in range(n):
            rows.append({"source": "a" if i % 2 else "b", "source_id": f"{code}-{i}", "url": f"http://x/{code}/{i}",
                         "key": f"k-{code}-{i}", "stage": stage, "reason": code, "detail": f"why {i}"})  # fmt: skip
    return pd.DataFrame(rows)


def test_stages_in_pipeline_order_with_optional_stages_before_shard():
    assert report.ordered_stages(["shard", "resize", "zeta", "download", "embed", "caption"]) == [
        "download", "caption", "resize", "embed", "zeta", "shard",
    ]  # fmt: skip


def test_funnel_subtracts_each_stage_and_ends_at_published():
    steps = report.funnel(STATS)
    assert steps == [
        ("input records", 100, 0),
        ("after download", 90, 10),
        ("after resize", 83, 7),
        ("after embed", 81, 2),
        ("after shard", 80, 1),
        ("published", 80, 0),
    ]
    assert report.funnel_line(STATS).startswith("100 input -> 90 after download")


def test_funnel_has_a_step_per_filter_before_download():
    stats = {
        **STATS,
        "input_records": 110,
        "rejected_by_stage": {**STATS["rejected_by_stage"], "filter": 10},
        "rejected_by_reason": {"filter/unsafe": 6, "filter/clip_similarity": 4},
    }
    assert report.funnel(stats)[:4] == [
        ("input records", 110, 0),
        ("after filter/clip_similarity", 106, 4),
        ("after filter/unsafe", 100, 6),
        ("after download", 90, 10),
    ]


def test_funnel_takes_the_filters_in_the_configs_order_each_a_step():
    """A record meets the filters in config order: the funnel too, with a step for one that left out nothing."""
    config = {"filters": [{"name": "unsafe", "column": "p"}, {"column": "W idth"}, {"name": "subset", "column": "u"}]}
    stats = {
        **STATS,
        "input_records": 110,
        "rejected_by_stage": {**STATS["rejected_by_stage"], "filter": 10},
        "rejected_by_reason": {"filter/unsafe": 6, "filter/w_idth": 4},
    }
    assert report.filter_names(config) == ["unsafe", "w_idth", "subset"]
    assert report.funnel(stats, report.filter_names(config))[:5] == [
        ("input records", 110, 0),
        ("after filter/unsafe", 104, 6),
        ("after filter/w_idth", 100, 4),
        ("after filter/subset", 100, 0),
        ("after download", 90, 10),
    ]
    assert report.funnel(STATS, ["subset"])[1] == ("after filter/subset", 100, 0)  # none left out at all


def test_funnel_refuses_stats_that_do_not_add_up():
    with pytest.raises(ValueError, match="do not add up"):
        report.funnel({**STATS, "published": 79})


def test_read_columns_subsamples_evenly_across_files(tmp_path):
    for i in range(3):
        pd.DataFrame({"x": range(i * 1000, (i + 1) * 1000), "y": 0}).to_parquet(tmp_path / f"{i}.parquet")
    paths = [str(tmp_path / f"{i}.parquet") for i in range(3)]
    df, total = report.read_columns(paths, ["x"], max_rows=300)
    assert total == 3000 and list(df.columns) == ["x"]
    assert list(df["x"]) == list(range(0, 3000, 10))  # every 10th row, across file boundaries
    full, _ = report.read_columns(paths, ["x"], max_rows=10_000)
    assert list(full["x"]) == list(range(3000))


def test_rejection_summary_counts_and_keeps_first_examples(tmp_path):
    path = tmp_path / "rejected.parquet"
    rejected_table({"download/not_found": 5, "caption/no_caption": 1}).to_parquet(path)
    summary = report.rejection_summary(str(path))
    assert summary["by_reason"] == {"download/not_found": 5, "caption/no_caption": 1}
    assert [e["source_id"] for e in summary["examples"]["download/not_found"]] == [
        "not_found-0",
        "not_found-1",
        "not_found-2",
    ]
    assert summary["by_source_stage"] == {("b", "download"): 3, ("a", "download"): 2, ("b", "caption"): 1}
    table = report.rejection_table(summary, input_records=50)
    assert list(table["reason"]) == ["not_found", "no_caption"]  # pipeline order
    assert list(table["count"]) == [5, 1] and table["share of input"].iloc[0] == "10.00 %"
    assert table["examples (source id: detail)"].iloc[0].splitlines() == [
        "not_found-0: why 0",
        "not_found-1: why 1",
        "not_found-2: why 2",
    ]


def test_shard_table_has_a_row_per_shard_and_a_total():
    infos = [
        {"shard": f"ds-00000{i}.tar", "nsamples": n, "filesize": 1000 * n, "sha256": f"{i}" * 64, "md5sum": f"{i}" * 32}
        for i, n in [(1, 4), (0, 8)]
    ]
    table = report.shard_table(infos)
    assert list(table["shard"]) == ["ds-000000.tar", "ds-000001.tar", "total (2 shards)"]
    assert list(table["samples"]) == [8, 4, 12] and table["bytes"].iloc[-1] == 12000
    assert table["sha256"].iloc[0] == "0" * 64


def test_html_table_escapes_and_formats_numbers():
    df = pd.DataFrame({"reason": ["<script>x</script>"], "count": [12345], "examples": ["a\nb"]})
    page = report.html_table(df, "Rejections", "intro & more")
    assert "<script>x" not in page and "&lt;script&gt;" in page
    assert '<td class="num">12,345</td>' in page and "a<br>b" in page and "intro &amp; more" in page


def test_model_name_and_random_weights_from_provenance():
    stats = {
        "model": "ViT-B-32",
        "provenance": {"model": "ViT-B-32", "pretrained": "/tmp/x/tiny.pt", "random_weights": True},
    }
    assert report.random_weights(stats)
    assert report.model_name(stats) == "ViT-B-32 / tiny.pt"


def test_random_weights_trusts_the_flag_over_names():
    assert not report.random_weights({"random_weights": False, "provenance": {"pretrained": "random-looking-name.pt"}})
    assert report.random_weights({"provenance": {"weights_statement": "RANDOM WEIGHTS: test model"}})
    assert not report.random_weights({"provenance": {"pretrained": "laion2b_s34b_b79k"}})


def test_similarity_column_prefers_datacomp_names():
    assert report.similarity_column(["key", "similarity", "clip_l14_similarity_score"]) == "clip_l14_similarity_score"
    assert report.norm_columns(["key", "clip_b32_image_norm", "clip_b32_text_norm", "clip_b32_similarity_score"]) == [
        "clip_b32_image_norm", "clip_b32_text_norm",
    ]  # fmt: skip
    with pytest.raises(ValueError):
        report.similarity_column(["key"])


def test_human_bytes():
    assert report.human_bytes(512) == "512 B" and report.human_bytes(2048) == "2.0 KiB"
    assert report.human_bytes(3 * 1024**3) == "3.0 GiB"
